"""Model-owned recurrent state: which slot roles each layer kind needs and its per-step bookkeeping.

Not carried: state that is not per request. A shared random-number counter (e.g. the Philox offset
for stochastic rounding) advances on every forward for the whole batch; it lives with the model, outside
the slots, and suspend/resume never copies it — restoring an old value would rewind the shared stream.
"""
from .attention import KVPages, MLAPages
from .auxiliary import AuxState
from .gdn import GDNState
from .kda import KDAState
from .mamba2 import Mamba2State

__all__ = ["AuxState", "GDNState", "KDAState", "KVPages", "MLAPages", "Mamba2State"]

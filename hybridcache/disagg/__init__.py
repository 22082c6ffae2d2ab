"""Disaggregated prefill and decode: a producer engine prefills prompts and hands each finished prompt's whole
cache state (K/V pages and every recurrent role, live bytes only, in the host tier's saved form) to a
consumer engine over torch.distributed point-to-point, which resumes it as a suspended request and decodes
it. Names after vLLM's (`KVTransferConfig`, `kv_role`). See docs/parallel.md."""
from .channel import KVChannel
from .config import KVTransferConfig
from .consumer import KVConsumer
from .errors import KVTransferError, TransferLayoutError
from .producer import KVProducer

__all__ = ["KVChannel", "KVConsumer", "KVProducer", "KVTransferConfig", "KVTransferError", "TransferLayoutError"]

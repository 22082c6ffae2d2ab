"""Make Triton 3.6's CPU interpreter skip a redundant re-patch; changes no result.

In the interpreter a kernel launch (`GridExecutor.__call__`) patches `triton.language` once — every
builtin is rebound to the numpy interpreter — runs the grid, and restores it. But every call of a
`@jit` helper inside the kernel (`tl.sum`, `tl.max`, `tl.zeros`, `tl.cdiv`, ... are such helpers, in
`triton.language.standard`) goes through `InterpretedFunction.__call__`, which calls `_patch_lang`
again: about 0.7 ms of `inspect.getmembers` over the language modules per call, thousands of calls per
test. Within one launch that re-patch is idempotent: it binds the same builtins to the same stateless
`TritonSemantic(interpreter_builder)` on the same modules (`triton.language` and/or
`triton.language.core`, whichever the helper's globals name), and Triton itself never restores it.

So, while a launch runs, `_patch_lang(fn)` is skipped when every language module `fn` sees has already
been patched in that launch. The launch's own patch, the first patch of a module a helper adds (a
helper seeing `triton.language.core` when the kernel only imported `triton.language`), and any call
outside a launch still run Triton's code unchanged.

Installed by tests/conftest.py only under TRITON_INTERPRET=1 with triton 3.6.x; a no-op otherwise.
"""

import functools
import inspect
import os
import threading

TRITON_VERSION_PREFIX = "3.6."

_state = threading.local()  # .patched: set of module ids patched in this thread's running launch


def install() -> bool:
    """Wrap the interpreter's `_patch_lang` and `GridExecutor.__call__`; True when installed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:
        return False
    if not triton.__version__.startswith(TRITON_VERSION_PREFIX):
        return False
    if getattr(interpreter, "_hybridcache_skip_repatch", False):
        return True
    language_modules = (interpreter.tl, interpreter.tl.core)
    patch_lang = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__

    def modules_seen_by(fn) -> frozenset[int]:
        # the same selection `_patch_lang` makes from the function's globals
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in language_modules)

    @functools.wraps(patch_lang)
    def patch_lang_once_per_launch(fn):
        patched = getattr(_state, "patched", None)
        seen = modules_seen_by(fn)
        if patched is not None and seen and seen <= patched:
            return interpreter._LangPatchScope()  # nothing to restore
        scope = patch_lang(fn)
        if patched is not None:
            patched |= seen
        return scope

    @functools.wraps(launch)
    def launch_tracking_patches(self, *args, **kwargs):
        outer = getattr(_state, "patched", None)
        _state.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state.patched = outer

    interpreter._patch_lang = patch_lang_once_per_launch
    interpreter.GridExecutor.__call__ = launch_tracking_patches
    interpreter._hybridcache_skip_repatch = True
    return True

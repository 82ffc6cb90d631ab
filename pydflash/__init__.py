"""pydflash: DFlash speculative decoding for llama.cpp GGUF models, driven from Python.

The public API lives in :mod:`pydflash.api` (``load``, ``Pair``); the step engine in :mod:`pydflash.engine`.
"""

__version__ = "0.1.0"

# Load our libllama before anything imports numpy: on a CUDA build, numpy 2.5 (its bundled OpenBLAS) loaded first
# made every model load crash inside llama.cpp (seen on an H200). Tools that need no native library (the weight
# comparison, the factory) keep working when it is absent.
try:
    from .native import _lib  # noqa: F401,E402
except Exception:  # NativeLibraryError, or a broken build: reported when the engine is used
    pass

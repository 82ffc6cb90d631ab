"""pydflash: DFlash speculative decoding for llama.cpp GGUF models, driven from Python.

The public API lives in :mod:`pydflash.api` (``load``, ``Pair``); the step engine in :mod:`pydflash.engine`.
"""

__version__ = "0.1.0"

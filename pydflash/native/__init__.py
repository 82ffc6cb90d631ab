"""The only package that touches ctypes.

Layers, after llama-cpp-python's own split:
- ``_lib``      loads our patched libllama and declares what llama-cpp-python lacks (llama-ext.h);
- ``handles``   owners of native lifetimes (model, context, batches), freeing in the right order;
- ``context``   the operations the engine needs, in numpy and Python types, with return codes turned into
                typed exceptions.
Nothing above this package sees pointers, ``byref`` or raw return codes.
"""

from . import _lib  # noqa: F401  first: libllama must be loaded before numpy (see pydflash/__init__.py)
from .handles import Model, ModelParams, ContextParams
from .context import Context, TokenBatch

__all__ = ["Model", "ModelParams", "Context", "ContextParams", "TokenBatch"]

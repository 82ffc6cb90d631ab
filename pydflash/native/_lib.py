"""Load our patched libllama through llama-cpp-python's declarations, and declare what those lack.

llama-cpp-python is installed with ``-DLLAMA_BUILD=OFF``: it ships no library of its own and reads
``LLAMA_CPP_LIB_PATH`` at import time, so that variable must point at our build *before* ``llama_cpp`` is
imported. The search order is ``PYDFLASH_LIB_DIR``, then an explicit ``LLAMA_CPP_LIB_PATH``, then the
build that ``scripts/build_native.sh`` installs under ``.cache/native/current/lib`` in the source tree.
"""

from __future__ import annotations

import collections
import ctypes
import os
import pathlib
import sys

from ..errors import NativeLibraryError

_REPO = pathlib.Path(__file__).resolve().parents[2]


def _find_lib_dir() -> pathlib.Path:
    for env in ("PYDFLASH_LIB_DIR", "LLAMA_CPP_LIB_PATH"):
        if os.environ.get(env):
            return pathlib.Path(os.environ[env])
    return _REPO / ".cache" / "native" / "current" / "lib"


LIB_DIR = _find_lib_dir()
if not (LIB_DIR / "libllama.so").exists():
    raise NativeLibraryError(
        f"libllama.so not found in {LIB_DIR}; run `make setup` (or set PYDFLASH_LIB_DIR to a patched build)"
    )
os.environ["LLAMA_CPP_LIB_PATH"] = str(LIB_DIR)


def set_verbose(on: bool) -> None:
    """Print llama.cpp's whole log from now on (PYDFLASH_VERBOSE), or only keep its errors for our messages.

    patches/0010: unless verbose, llama.cpp's debug lines stop in C (GGML_LOG_SKIP_DEBUG, read at each such line).
    Some come on every step (each replay of a CUDA graph logs one), and a line that reaches _log_py takes the GIL
    inside the forward, where a server's other threads may hold it."""
    os.environ["PYDFLASH_VERBOSE"] = "1" if on else ""
    os.environ["GGML_LOG_SKIP_DEBUG"] = "0" if on else "1"


if os.environ.get("PYDFLASH_VERBOSE"):
    set_verbose(True)
else:  # GGML_LOG_SKIP_DEBUG=0 passes the lines without printing them (scripts/dev/remote.sh split)
    os.environ.setdefault("GGML_LOG_SKIP_DEBUG", "1")
# libllama's RUNPATH names the build tree it was linked in; loading its ggml dependencies from LIB_DIR first
# makes the installed copy independent of that tree (the loader reuses an object already loaded under the same
# soname). RTLD_LOCAL: exporting them globally let symbols interpose across backends and crashed CUDA builds.
# libggml-rpc.so exists in builds with -DGGML_RPC=ON (scripts/build_native.sh); native/rpc.py uses the handles.
ggml_libs: dict[str, ctypes.CDLL] = {}
for _dep in ("libggml-base.so", "libggml-cpu.so", "libggml-rpc.so", "libggml.so"):
    if (LIB_DIR / _dep).exists():
        ggml_libs[_dep] = ctypes.CDLL(str(LIB_DIR / _dep), mode=ctypes.RTLD_LOCAL)

import llama_cpp.llama_cpp as C  # noqa: E402  (must follow the environment setup above)

GGML_LOG_LEVEL_ERROR = 4  # ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
GGML_LOG_LEVEL_CONT = 5
_last_level = 0
log_lines = collections.Counter()  # lines llama.cpp's logger passed to _log_py, by level (patches/0010's test)
# llama.cpp's recent error lines: folded into our exceptions (one line for the user) instead of printed.
recent_errors: "collections.deque[str]" = collections.deque(maxlen=8)
interrupted = False  # a KeyboardInterrupt that ended inside the log callback (_keep_interrupts)


def _log_py(level, text, _user):
    """llama.cpp logs every tensor at load: keep its errors for our messages; print all only if PYDFLASH_VERBOSE."""
    global _last_level
    log_lines[level] += 1
    if level != GGML_LOG_LEVEL_CONT:
        _last_level = level
    msg = text.decode("utf-8", "replace")
    if _last_level == GGML_LOG_LEVEL_ERROR and msg.strip():
        recent_errors.append(msg.strip())
    if os.environ.get("PYDFLASH_VERBOSE"):
        sys.stderr.write(msg)


_log = C.llama_log_callback(_log_py)


def _keep_interrupts(unraisable, _previous=sys.unraisablehook) -> None:
    """A Ctrl-C that lands while llama.cpp is inside our log callback cannot leave it: ctypes hands the
    KeyboardInterrupt to sys.unraisablehook, which printed "Exception ignored ..." and dropped it, and the
    generation ran on. Keep it instead, for the native call's wrapper to raise when the call returns
    (raise_if_interrupted); every other report goes to the previous hook."""
    global interrupted
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and unraisable.object is _log_py:
        interrupted = True
        return
    _previous(unraisable)


sys.unraisablehook = _keep_interrupts


def raise_if_interrupted() -> None:
    """Raise the KeyboardInterrupt that arrived inside a llama.cpp callback during the native call just made."""
    global interrupted
    if interrupted:
        interrupted = False
        raise KeyboardInterrupt


def last_error() -> str:
    """The first llama.cpp error line logged since the last call (the root cause), or ''."""
    first = recent_errors[0] if recent_errors else ""
    recent_errors.clear()
    return first


C.llama_log_set(_log, ctypes.c_void_p(0))

lib = C._lib

c_ctx_p = ctypes.c_void_p
c_model_p = ctypes.c_void_p


# The same library through a PyDLL: its functions keep the GIL during the call. A CDLL function releases it and
# takes it back on return, and in a server worker the event loop's thread, busy sending a step's 16 streams, can
# hold it for up to sys.getswitchinterval() before the engine thread gets it back. A 16-slot step makes a few dozen
# such calls (rollbacks, picks, feature rows): beside a thread busy with Python, its commit took 2.2-3.0 ms with
# CDLL bindings against 0.9-1.0 ms with these on the development CPU. Only calls that return in microseconds use
# it; a forward (llama_decode) and state copies still let other threads run.
_gil_lib = ctypes.PyDLL(lib._name, handle=lib._handle)


def _declare(name: str, argtypes: list, restype, keep_gil: bool = False):
    try:
        # lib[name] makes a fresh function object: setting argtypes on getattr(lib, name) would change the one
        # llama-cpp-python's own wrappers share
        fn = (_gil_lib if keep_gil else lib)[name]
    except AttributeError as exc:  # an unpatched build exports these only under C++ mangled names
        raise NativeLibraryError(
            f"{name} is not exported by {LIB_DIR}/libllama.so; is patches/0002-c-linkage-for-dflash-ext-api applied?"
        ) from exc
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


# llama-ext.h, given C linkage by patches/0002.
# void llama_set_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid, bool value);
llama_set_embeddings_layer_inp = _declare(
    "llama_set_embeddings_layer_inp", [c_ctx_p, ctypes.c_uint32, ctypes.c_bool], None, keep_gil=True
)
# float * llama_get_embeddings_layer_inp(struct llama_context * ctx, uint32_t lid), returned as an address (an int):
# the engine reads it for every layer in every step, and only compares it with the last one unless llama.cpp moved
# the buffer
embeddings_layer_inp_addr = _declare(
    "llama_get_embeddings_layer_inp", [c_ctx_p, ctypes.c_uint32], ctypes.c_void_p, keep_gil=True
)
# const int32_t * llama_model_target_layer_ids(const struct llama_model * model);
llama_model_target_layer_ids = _declare(
    "llama_model_target_layer_ids", [c_model_p], ctypes.POINTER(ctypes.c_int32)
)
# uint32_t llama_model_target_layer_ids_n(const struct llama_model * model);
llama_model_target_layer_ids_n = _declare("llama_model_target_layer_ids_n", [c_model_p], ctypes.c_uint32)
# llama_context * llama_get_ctx_other(struct llama_context * ctx);
llama_get_ctx_other = _declare("llama_get_ctx_other", [c_ctx_p], c_ctx_p)
# void llama_set_spare_sched_ext(struct llama_context * ctx, bool on);  (patches/0012)
llama_set_spare_sched_ext = _declare("llama_set_spare_sched_ext", [c_ctx_p, ctypes.c_bool], None)

# Hot-path bindings declared directly on the library: the engine calls these once per row / per output every
# step, and llama-cpp-python's Python-level wrappers cost more than the calls themselves.

# llama_token llama_get_sampled_token_ith(struct llama_context * ctx, int32_t i);
get_sampled_token_ith = _declare("llama_get_sampled_token_ith", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32,
                                 keep_gil=True)
# int32_t llama_get_sampled_tokens_ext(struct llama_context * ctx, const int32_t * idx, int32_t n, llama_token * out);
# (patches/0008: n of the above in one call, one synchronization)
get_sampled_tokens = _declare(
    "llama_get_sampled_tokens_ext", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p], ctypes.c_int32,
    keep_gil=True,  # the decode that made the outputs synchronized already: its synchronization returns at once
)
# Backend sampling outputs of a dist chain (rejection sampling reads p and q through these, llama.h):
# float *  llama_get_sampled_probs_ith      (struct llama_context * ctx, int32_t i);
get_sampled_probs_ith = _declare(
    "llama_get_sampled_probs_ith", [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float), keep_gil=True
)
# uint32_t llama_get_sampled_probs_count_ith(struct llama_context * ctx, int32_t i);
get_sampled_probs_count_ith = _declare(
    "llama_get_sampled_probs_count_ith", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_uint32, keep_gil=True
)
# llama_token * llama_get_sampled_candidates_ith      (struct llama_context * ctx, int32_t i);
get_sampled_candidates_ith = _declare(
    "llama_get_sampled_candidates_ith", [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_int32), keep_gil=True
)
# uint32_t      llama_get_sampled_candidates_count_ith(struct llama_context * ctx, int32_t i);
get_sampled_candidates_count_ith = _declare(
    "llama_get_sampled_candidates_count_ith", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_uint32, keep_gil=True
)
# Bookkeeping of every step (llama.h), the same signatures as llama-cpp-python's, keeping the GIL (_gil_lib):
# bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
memory_seq_rm = _declare("llama_memory_seq_rm", [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32],
                         ctypes.c_bool, keep_gil=True)
# llama_pos llama_memory_seq_pos_max / _min(llama_memory_t mem, llama_seq_id seq_id);
memory_seq_pos_max = _declare("llama_memory_seq_pos_max", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32,
                              keep_gil=True)
memory_seq_pos_min = _declare("llama_memory_seq_pos_min", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32,
                              keep_gil=True)
# void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0,
#                          llama_pos p1);
memory_seq_cp = _declare("llama_memory_seq_cp", [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                                 ctypes.c_int32], None, keep_gil=True)
# void llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
sampler_accept = _declare("llama_sampler_accept", [ctypes.c_void_p, ctypes.c_int32], None, keep_gil=True)
# bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
vocab_is_eog = _declare("llama_vocab_is_eog", [ctypes.c_void_p, ctypes.c_int32], ctypes.c_bool, keep_gil=True)

_backend_ready = False


def ensure_backend() -> None:
    """llama_backend_init once per process (it loads the CPU/GPU backends)."""
    global _backend_ready
    if not _backend_ready:
        C.llama_backend_init()
        _backend_ready = True

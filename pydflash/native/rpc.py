"""The target's device list with llama.cpp RPC servers in it, through ggml's backend registry API.

What llama.cpp itself does for ``--rpc`` (common/arg.cpp ``add_rpc_devices``): look up the "RPC" backend registry,
take its ``ggml_backend_rpc_add_server`` through ``ggml_backend_reg_get_proc_address``, and call it per endpoint;
each call returns a registry holding that server's devices. llama.cpp then registers them globally, so every model
of the process would offload to them. Here they go only into the target's NULL-terminated
``llama_model_params.devices``, RPC devices first and then the local GPUs (the order of llama.cpp's default list:
the last layers and the output head stay local, so logits do not cross the network). The drafter is loaded with
``devices = NULL``, which lists only registered (local) devices: it stays next to the target features it reads.

A DFlash drafter without a head of its own runs the target's output head (and reads its token embeddings, which
llama.cpp always keeps on the CPU) inside the drafter's graph, whose scheduler has only local backends: a head
left on an RPC device aborts the drafter's first decode. With no local GPU to end the list, a tensor override
(``llama_model_params.tensor_buft_overrides``, llama.cpp's ``-ot``) therefore keeps the target's output tensors in
CPU memory.

llama.cpp aborts the process when a server does not answer, so ``target_devices`` runs ``pydflash.rpc_endpoints.probe``
first, except for a server this process already holds a connection to through a live model (llama.cpp shares
one connection per endpoint, and the server would not answer a second one).
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Optional, Sequence

from ..errors import NativeLibraryError
from ..rpc_endpoints import RpcUnreachable, parse_endpoint, probe
from ._lib import LIB_DIR, ensure_backend, ggml_libs

GGML_BACKEND_DEVICE_TYPE_CPU = 0  # ggml-backend.h: CPU 0, GPU 1, IGPU 2, ACCEL 3, META 4
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
_c_p = ctypes.c_void_p
# ggml_backend_reg_t (*ggml_backend_rpc_add_server_t)(const char * endpoint);
_ADD_SERVER = ctypes.CFUNCTYPE(_c_p, ctypes.c_char_p)

if "libggml.so" not in ggml_libs:
    raise NativeLibraryError(f"libggml.so not found in {LIB_DIR}: RPC devices need llama.cpp's ggml library")


def _declare(name: str, argtypes: list, restype):
    fn = ggml_libs["libggml.so"][name]  # dlsym on libggml also finds libggml-base's symbols (its dependency)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


# ggml-backend.h
_reg_by_name = _declare("ggml_backend_reg_by_name", [ctypes.c_char_p], _c_p)
_reg_get_proc_address = _declare("ggml_backend_reg_get_proc_address", [_c_p, ctypes.c_char_p], _c_p)
_reg_dev_count = _declare("ggml_backend_reg_dev_count", [_c_p], ctypes.c_size_t)
_reg_dev_get = _declare("ggml_backend_reg_dev_get", [_c_p, ctypes.c_size_t], _c_p)
_dev_count = _declare("ggml_backend_dev_count", [], ctypes.c_size_t)
_dev_get = _declare("ggml_backend_dev_get", [ctypes.c_size_t], _c_p)
_dev_type = _declare("ggml_backend_dev_type", [_c_p], ctypes.c_int)
_dev_name = _declare("ggml_backend_dev_name", [_c_p], ctypes.c_char_p)
_dev_by_type = _declare("ggml_backend_dev_by_type", [ctypes.c_int], _c_p)
_dev_buffer_type = _declare("ggml_backend_dev_buffer_type", [_c_p], _c_p)

# the output layer's tensors (output.weight, and token_embd.weight where the head is tied to the embeddings; the
# input copy is on the CPU anyway), not output_norm: llama.cpp matches with std::regex_search on the tensor name
OUTPUT_ON_CPU = rb"^(output|token_embd)\."


class BuftOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", _c_p)]


_lock = threading.Lock()
_live: "collections.Counter[str]" = collections.Counter()  # endpoint -> live models connected to it


class DeviceList:
    """A NULL-terminated ``ggml_backend_dev_t`` array for ``llama_model_params.devices`` and the endpoints it uses.
    ``hold()`` once the model loaded, ``release()`` when it is freed (the connection closes with it)."""

    def __init__(self, devices: list, endpoints: tuple[str, ...], output_on_cpu: bool):
        self.array = (_c_p * (len(devices) + 1))(*devices, None)
        self.names = [_dev_name(d).decode() for d in devices]
        self.endpoints = endpoints
        self.overrides = None  # NULL-terminated (pattern NULL), for llama_model_params.tensor_buft_overrides
        if output_on_cpu:
            cpu = _dev_buffer_type(_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU))
            self.overrides = (BuftOverride * 2)(BuftOverride(OUTPUT_ON_CPU, cpu), BuftOverride(None, None))
        self._held = False

    @property
    def ptr(self) -> int:
        return ctypes.cast(self.array, _c_p).value

    @property
    def overrides_ptr(self):
        return ctypes.cast(self.overrides, _c_p).value if self.overrides is not None else None

    def hold(self) -> None:
        with _lock:
            _live.update(self.endpoints)
            self._held = True

    def release(self) -> None:
        with _lock:
            if self._held:
                _live.subtract(self.endpoints)
                self._held = False


def target_devices(endpoints: Sequence[str], timeout_s: Optional[float] = None) -> DeviceList:
    """RPC devices of these ``ip:port`` endpoints (resolved and checked by ``pydflash.rpc_endpoints.resolve_all``),
    then the local GPUs. Raises RpcUnreachable for a server that does not answer in time."""
    ensure_backend()
    reg = _reg_by_name(b"RPC")
    if not reg:
        raise NativeLibraryError("this llama.cpp build has no RPC backend: rebuild with -DGGML_RPC=ON "
                                 "(scripts/build_native.sh does)")
    add_server = _ADD_SERVER(_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
    devices = []
    for ep in endpoints:
        with _lock:
            connected = _live[ep] > 0
        if not connected:
            probe(parse_endpoint(ep), timeout_s)
        server = add_server(ep.encode())
        if not server:
            raise RpcUnreachable(f"RPC server {ep} exposes no devices")
        devices += [_reg_dev_get(server, i) for i in range(_reg_dev_count(server))]
    gpus = local_gpus()
    return DeviceList(devices + gpus, tuple(endpoints), output_on_cpu=not gpus)


def local_gpus() -> list:
    """The local GPUs llama.cpp would offload to by default (integrated ones only when there is no discrete one)."""
    devs = [_dev_get(i) for i in range(_dev_count())]
    gpus = [d for d in devs if _dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU]
    return gpus or [d for d in devs if _dev_type(d) == GGML_BACKEND_DEVICE_TYPE_IGPU]

"""Load a target and (optionally) a DFlash drafter as a checked pair."""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from .compat import inherit, pairing
from .compat.gguf_meta import read_metadata
from .native import Model, ModelParams
from .rpc_endpoints import resolve_all

log = logging.getLogger(__name__)
PathLike = Union[str, pathlib.Path]


@dataclass
class Pair:
    target: Model
    drafter: Optional[Model]
    block_size: int = 0
    mask_token: int = -1
    feature_layers: tuple[int, ...] = ()
    # embedding scale and logit softcap the drafter applies (inherited from the target where the file lacks them)
    transforms: Optional[inherit.Transforms] = None

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()


def load_pair(
    target: PathLike,
    drafter: Optional[PathLike] = None,
    n_gpu_layers: int = 0,
    allow_scale_mismatch: bool = False,
    target_kv_overrides: Optional[dict] = None,
    rpc: Sequence[str] = (),
    rpc_allow_public: bool = False,
) -> Pair:
    """Load the target, then the drafter with the target's Gemma transforms supplied where it lacks them.

    rpc: llama.cpp RPC servers ("host:port") that take the target's offloaded layers (n_gpu_layers of them, split
    with the local GPUs); the drafter stays local. Private addresses only unless rpc_allow_public
    (pydflash.rpc_endpoints).

    Raises ModelLoadError for unreadable files (RpcUnreachable for an RPC server that does not answer),
    RpcEndpointError for an endpoint refused by the address policy, and IncompatibleDrafter for a drafter that
    does not fit.
    """
    servers = resolve_all(rpc, rpc_allow_public) if rpc else ()
    tgt = Model(target, ModelParams(n_gpu_layers=n_gpu_layers, kv_overrides=target_kv_overrides or {}, rpc=servers))
    if servers:
        log.info("target %s: offloaded layers on %s", target, ", ".join(tgt.devices))
    if drafter is None:
        return Pair(tgt, None)
    try:
        drafter_path = inherit.prepare_drafter_file(pathlib.Path(drafter))
        dmeta = read_metadata(drafter_path)
        info = pairing.check_pair(tgt, dmeta)  # on metadata: llama.cpp's own load errors name no mismatch
        overrides, transforms = inherit.drafter_overrides(tgt, dmeta, allow_mismatch=allow_scale_mismatch)
        dft = Model(drafter_path, ModelParams(n_gpu_layers=n_gpu_layers, kv_overrides=overrides))
    except BaseException:
        tgt.close()
        raise
    return Pair(tgt, dft, block_size=info.block_size, mask_token=info.mask_token, feature_layers=info.target_layers,
                transforms=transforms)

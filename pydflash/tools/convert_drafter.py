"""z-lab DFlash checkpoint -> a drafter GGUF for a given target GGUF: convert, then optionally quantize and give it a
reduced head. The Python API under ``pydflash-convert-drafter``.

    from pydflash.tools.convert_drafter import convert_drafter
    result = convert_drafter("Qwen3-4B-DFlash-b16/", "Qwen3-4B-Q4_K_M.gguf", "qwen3-4b-dflash.gguf")

Everything is checked before a byte is written (zlab.read_config, zlab.check_against_target, zlab_gguf.plan);
failures raise zlab.CheckpointError or zlab.PairingError (ModelLoadError for an unreadable target GGUF). Nothing
here downloads anything.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..compat import zlab, zlab_gguf
from ..compat.gguf_meta import read_metadata
from ..compat.reduced_head import write_reduced_head
from ..tools.compare.errors import BadInput
from ..tools.compare.source import SafetensorsSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Conversion:
    out: Path | None  # None for a dry run
    config: zlab.ZlabConfig
    n_tensors: int
    n_params: int
    nbytes: int  # of the converted weights, before any quantization
    fc_params: int
    caveats: tuple[str, ...] = ()  # converted, but not quite as z-lab's reference runs it (also logged)


def convert_drafter(drafter_dir: str | Path, target: str | Path, out: str | Path | None, outtype: str = "auto",
                    quantize: str | None = None, head_ids: Sequence[int] | None = None, head_type: str = "Q8_0",
                    d2t_type: str = "I32", dry_run: bool = False) -> Conversion:
    """Convert ``drafter_dir`` (config.json + safetensors) for the target GGUF ``target`` into ``out``.

    quantize: a llama.cpp type (Q8_0, Q4_K_M, ...) for every matrix but fc; head_ids: target token ids for a
    reduced lm_head (compat.reduced_head: I32 d2t for pydflash's build, I64 for upstream llama.cpp).
    """
    cfg = zlab.read_config(drafter_dir)
    tmeta = read_metadata(target)  # ModelLoadError for an unreadable target
    try:
        source = SafetensorsSource(drafter_dir)
    except BadInput as exc:
        raise zlab.CheckpointError(str(exc)) from exc
    zlab.check_against_target(cfg, tmeta)
    caveats = tuple(zlab.caveats(cfg, tmeta))
    for line in caveats:
        log.warning("%s: %s", cfg.path.parent.name, line)
    tensors = zlab_gguf.plan(cfg, source, outtype)
    n_params = sum(_count(p.src.shape) for p in tensors)
    fc = next(_count(p.src.shape) for p in tensors if p.gguf_name == "fc.weight")
    result = Conversion(None, cfg, len(tensors), n_params, sum(p.nbytes for p in tensors), fc, caveats)
    if dry_run or out is None:
        return result
    out = Path(out)
    first = _scratch(out, "f") if quantize is not None or head_ids is not None else out
    zlab_gguf.write(cfg, tmeta, source, tensors, first)
    _post_process(first, out, target, quantize, head_ids, head_type, d2t_type)
    log.info("wrote %s (%d tensors, %.1f M parameters)", out, len(tensors), n_params / 1e6)
    return replace(result, out=out)


def _post_process(current: Path, out: Path, target, quantize, head_ids, head_type: str, d2t_type: str) -> None:
    """Quantize (keeping fc), then add a reduced head; each step reads the previous file and deletes it."""
    try:
        if quantize is not None:
            from ..compat.drafter_quant import quantize_drafter  # loads the native library: only when asked

            nxt = _scratch(out, "q") if head_ids is not None else out
            quantize_drafter(current, nxt, quantize)
            _drop(current, out)
            current = nxt
        if head_ids is not None:
            write_reduced_head(current, target, head_ids, out, head_type=head_type, d2t_type=d2t_type)
            _drop(current, out)
    except BaseException:
        _drop(current, out)
        raise


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _scratch(out: Path, tag: str) -> Path:
    return out.with_name(f".{out.name}.{tag}{os.getpid()}.gguf")


def _drop(path: Path, keep: Path) -> None:
    if path != keep:
        path.unlink(missing_ok=True)

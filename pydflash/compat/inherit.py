"""Gemma-family transforms a drafter inherits from its target.

A DFlash drafter borrows the target's token embeddings and lm_head, so it must apply the target's transforms
around them:
- Gemma targets multiply input embeddings by sqrt(n_embd) inside their own graph (the stored table is unscaled),
  so the drafter's noise embeddings need ``dflash.embedding_scale = sqrt(n_embd_target)``. Upstream's dflash graph
  applies that key exactly once to the noise embeddings; supplying it as well as scaling by hand would scale twice.
- Gemma-2/4 soft-cap final logits at 30 (``final_logit_softcapping``). Monotonic, so greedy picks do not change,
  but sampling does; the drafter gets the same cap.
Other architectures get neither.

Where the drafter GGUF lacks a key we supply it at load through ``kv_overrides``; where it states a value that
disagrees with the target we refuse, unless the caller allows it.
"""

from __future__ import annotations

import logging
import math
import pathlib

from ..errors import IncompatibleDrafter
from ..native import Model
from . import fork_layout
from .gguf_meta import read_metadata

log = logging.getLogger(__name__)

GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma4"})
SCALE_KEY = "dflash.embedding_scale"
SOFTCAP_KEY = "dflash.final_logit_softcapping"


def prepare_drafter_file(path: pathlib.Path) -> pathlib.Path:
    """The upstream-layout file to load: the file itself, or a converted copy of a fork-era drafter."""
    meta = read_metadata(path)
    if meta.get("general.architecture") == fork_layout.FORK_ARCH:
        return fork_layout.convert_cached(path, meta)
    return path


def expected_transforms(target: Model) -> tuple[float | None, float | None]:
    """(embedding scale, final logit softcap) the drafter must apply for this target; None = not needed."""
    if target.arch not in GEMMA_ARCHS:
        return None, None
    scale = math.sqrt(target.n_embd)
    cap = target.meta(f"{target.arch}.final_logit_softcapping")
    cap = float(cap) if cap not in (None, "", "0", "0.0") else None
    return scale, cap


def drafter_overrides(target: Model, drafter_path: pathlib.Path, allow_mismatch: bool = False) -> dict:
    meta = read_metadata(drafter_path)
    want_scale, want_cap = expected_transforms(target)
    overrides: dict = {}
    have_scale = meta.get(SCALE_KEY)
    if have_scale is None:
        if want_scale is not None:
            overrides[SCALE_KEY] = float(want_scale)
    elif not _same(have_scale, want_scale if want_scale is not None else 1.0) and float(have_scale) != 0.0:
        _mismatch("embedding scale", have_scale, want_scale or 1.0, target, allow_mismatch)
    have_cap = meta.get(SOFTCAP_KEY)
    if have_cap is None:
        if want_cap is not None:
            overrides[SOFTCAP_KEY] = float(want_cap)
    elif want_cap is not None and not _same(have_cap, want_cap):
        _mismatch("final logit softcap", have_cap, want_cap, target, allow_mismatch)
    eff_scale = overrides.get(SCALE_KEY, have_scale)
    eff_cap = overrides.get(SOFTCAP_KEY, have_cap)
    log.info("drafter %s on %s target: embedding_scale=%s%s, final_logit_softcapping=%s%s",
             drafter_path.name, target.arch, eff_scale, " (inherited)" if SCALE_KEY in overrides else "",
             eff_cap, " (inherited)" if SOFTCAP_KEY in overrides else "")
    return overrides


def _same(a, b) -> bool:
    return math.isclose(float(a), float(b), rel_tol=1e-4)


def _mismatch(what: str, have, want, target: Model, allow: bool) -> None:
    msg = f"drafter {what} is {float(have):g} but the {target.arch} target needs {float(want):g}"
    if not allow:
        raise IncompatibleDrafter(msg + " (pass allow_scale_mismatch to use the drafter's value)")
    log.warning("%s; using the drafter's value as asked", msg)

"""Transforms a drafter inherits from its target.

A DFlash drafter borrows the target's token embeddings and lm_head, so it must apply the target's transforms
around them:
- Gemma targets multiply input embeddings by sqrt(n_embd) inside their own graph (the stored table is unscaled),
  so the drafter's noise embeddings need ``dflash.embedding_scale = sqrt(n_embd_target)``. Upstream's dflash graph
  (src/models/dflash.cpp) applies that key exactly once, right after ``get_rows`` ("inp_noise_embd"); scaling
  by hand as well would scale twice. Targets that declare ``{arch}.embedding_scale`` (Granite) need that value.
- Gemma-2/4 soft-cap final logits at 30 (``final_logit_softcapping``). Monotonic, so greedy picks do not change,
  but sampling does. Note: the DFlash-1 graph does not apply the cap itself (only DFlash-2's selector does); the
  key is loaded into hparams and reported here so the sampler can apply it to drafter logits.
Other architectures get neither.

Where the drafter GGUF lacks a key we supply it at load through ``kv_overrides``; llama.cpp's loader consults
overrides before the file (``GGUFMeta::GKV::set``), so an override works for keys the file does not have. A
stored 0.0 means "unset" to llama.cpp (the model saver writes it by default) and is treated as missing. Where the
drafter states a value that disagrees with the target we refuse, unless the caller allows it.
"""

from __future__ import annotations

import logging
import math
import pathlib
from dataclasses import dataclass

from ..errors import IncompatibleDrafter
from ..native import Model
from . import fork_layout
from .gguf_meta import GGUFMeta, read_metadata

log = logging.getLogger(__name__)

GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma4"})
SCALE_KEY = "dflash.embedding_scale"
SOFTCAP_KEY = "dflash.final_logit_softcapping"


class TransformMismatch(IncompatibleDrafter):
    """The drafter states an embedding scale or softcap that disagrees with its target.

    ``fact`` says what disagrees, naming the drafter file. The way out depends on the caller (the Python API's
    ``allow_scale_mismatch=True``, the CLI's ``--allow-scale-mismatch``): ``str()`` phrases it for the API, and
    other front ends phrase their own from ``fact``.
    """

    def __init__(self, fact: str):
        super().__init__(f"{fact} (pass allow_scale_mismatch=True to use the drafter's value)")
        self.fact = fact


@dataclass(frozen=True)
class Transforms:
    embedding_scale: float | None  # multiplies the noise embeddings; None = unscaled
    logit_softcap: float | None  # tanh cap on final logits; None = no cap


def prepare_drafter_file(path: pathlib.Path) -> pathlib.Path:
    """The upstream-layout file to load: the file itself, or a converted copy of a fork-era drafter."""
    if read_metadata(path).arch == fork_layout.FORK_ARCH:
        return fork_layout.convert_cached(path)
    return path


def target_transforms(target: Model) -> Transforms:
    """What the drafter must apply for this target."""
    if target.arch in GEMMA_ARCHS:
        scale = math.sqrt(target.n_embd)
    else:
        scale = _positive(target.meta(f"{target.arch}.embedding_scale"))
    return Transforms(scale, _positive(target.meta(f"{target.arch}.final_logit_softcapping")))


def drafter_overrides(target: Model, dmeta: GGUFMeta, allow_mismatch: bool = False) -> tuple[dict, Transforms]:
    """(kv_overrides for loading the drafter, the transforms it will then apply)."""
    want = target_transforms(target)
    overrides: dict = {}
    eff = []
    for key, what, wanted in ((SCALE_KEY, "embedding scale", want.embedding_scale),
                              (SOFTCAP_KEY, "final logit softcap", want.logit_softcap)):
        have = _positive(dmeta.get(key))
        if key == SCALE_KEY and wanted is None and have is not None and math.isclose(have, 1.0):
            have = None  # a stated 1.0 scales nothing: what an unscaled target needs (converters write it)
        if have is None and wanted is not None:
            overrides[key] = float(wanted)
            eff.append(wanted)
        elif have is not None and (wanted is None or not math.isclose(have, wanted, rel_tol=1e-4)):
            _mismatch(dmeta.path, what, have, wanted, target, allow_mismatch)
            eff.append(have)
        else:
            eff.append(have)
    out = Transforms(*eff)
    log.info("drafter %s on %s target: embedding_scale=%s%s, final_logit_softcapping=%s%s",
             dmeta.path.name, target.arch, out.embedding_scale, " (inherited)" if SCALE_KEY in overrides else "",
             out.logit_softcap, " (inherited)" if SOFTCAP_KEY in overrides else "")
    return overrides, out


def _positive(value) -> float | None:
    """A metadata value as a float, or None where absent or 0 (llama.cpp's "unset")."""
    try:
        v = float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _mismatch(path: pathlib.Path, what: str, have: float, want: float | None, target: Model, allow: bool) -> None:
    need = f"{want:g}" if want is not None else "none"
    msg = f"drafter {path}: {what} is {have:g} but the {target.arch} target needs {need}"
    if not allow:
        raise TransformMismatch(msg)
    log.warning("%s; using the drafter's value as asked", msg)

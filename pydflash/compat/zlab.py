"""z-lab DFlash checkpoints (``config.json`` + safetensors, as ``dflash`` 0.1.0's DFlashDraftModel saves them):
what they say, and whether they fit a target GGUF, before anything is written.

A z-lab drafter is a Qwen3-style stack (``model_type: qwen3``) with ``fc`` [hidden, n_ctx_layers * hidden],
``hidden_norm``, ``norm`` and ``layers.N.*``; no embeddings or head (it borrows the target's). Its DFlash settings sit
in ``dflash_config`` (or, in older files, at the top level, where z-lab's ``_draft_value`` also looks):
``target_layer_ids`` (raw HF ids: the output of layer i), ``mask_token_id``, ``block_size`` (default 16), and for
Gemma targets ``input_embedding_scale`` / ``final_logit_softcapping``. Without ``target_layer_ids`` z-lab's code
spreads them over ``num_target_layers`` (``build_target_layer_ids``); so does this reader.

Every refusal is one line naming the file and the fix, raised as a typed error: ``CheckpointError`` for a checkpoint
that is not a convertible DFlash-1 drafter, ``PairingError`` for one that does not fit the given target.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import IncompatibleDrafter, ModelLoadError, PydflashError
from .gguf_meta import GGUFMeta
from .pairing import MAX_BLOCK, MIN_BLOCK

ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_pytorch_tanh"}  # what dflash.cpp runs


class ConversionError(PydflashError):
    """A z-lab checkpoint could not be converted (the CLI's exit 2)."""


class CheckpointError(ConversionError, ModelLoadError):
    """The checkpoint is not a convertible DFlash-1 drafter: unreadable config, missing or unexpected tensors."""


class PairingError(ConversionError, IncompatibleDrafter):
    """The drafter does not fit the target GGUF: width, depth, mask token, block size."""


@dataclass(frozen=True)
class ZlabConfig:
    path: Path  # the config.json
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int
    rms_eps: float
    rope_base: float
    n_rot: int | None  # partial rotary: rotated dims per head; None = all
    target_layer_ids: tuple[int, ...]  # raw HF ids
    n_target_layers: int | None
    mask_token_id: int
    block_size: int
    hidden_act: str
    vocab_size: int | None
    embedding_scale: float | None  # input_embedding_scale; None where absent or 1 (no scaling)
    logit_softcap: float | None
    logit_scale: float | None  # output_multiplier
    name: str
    sliding_window: int | None = None  # the window of the sliding_attention layers
    swa_layers: tuple[bool, ...] = ()  # per layer: sliding_attention (empty: none)
    causal_swa: bool = False  # z-lab's reference runs the sliding layers causally (is_causal unset)

    @property
    def layer_inputs(self) -> tuple[int, ...]:
        """What the GGUF stores: the input of layer i + 1 is the output of layer i."""
        return tuple(i + 1 for i in self.target_layer_ids)


def build_target_layer_ids(n_target_layers: int, n_draft_layers: int) -> list[int]:
    """z-lab's default spread (dflash.model.build_target_layer_ids), for configs that state no ids."""
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    start, end = 1, n_target_layers - 3
    return [round(start + i * (end - start) / (n_draft_layers - 1)) for i in range(n_draft_layers)]


def read_config(folder: str | Path) -> ZlabConfig:
    """Parse ``folder/config.json``; CheckpointError for anything this converter cannot carry over exactly."""
    path = Path(folder) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    _check_supported(cfg, path)
    try:
        return _parse(cfg, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: missing or malformed field {exc}") from exc


def _draft(cfg: dict, key: str, default=None):
    """z-lab's lookup order: dflash_config first, then the top level."""
    return (cfg.get("dflash_config") or {}).get(key, cfg.get(key, default))


def _check_supported(cfg: dict, path: Path) -> None:
    archs = cfg.get("architectures") or []
    if "DFlash2DraftModel" in archs:
        raise CheckpointError(f"{path}: DFlash2 (convolutions and a candidate selector) is not supported; "
                              "only DFlashDraftModel checkpoints convert")
    if "DFlashDraftModel" not in archs:
        raise CheckpointError(f"{path}: architectures {archs} name no DFlashDraftModel")
    if cfg.get("attention_bias"):
        raise CheckpointError(f"{path}: attention_bias is not supported by llama.cpp's dflash graph")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(f"{path}: rope type {rope.get('rope_type', rope.get('type'))!r} is not carried over; "
                              "only default rope converts")
    if cfg.get("hidden_act", "silu") not in ACTIVATIONS:
        raise CheckpointError(f"{path}: hidden_act {cfg['hidden_act']!r} is not one of {sorted(ACTIVATIONS)}")
    if cfg.get("is_causal", _draft(cfg, "causal")):
        raise CheckpointError(f"{path}: a causal drafter is not supported: pydflash runs the drafter non-causally")
    if "sliding_attention" in (cfg.get("layer_types") or []) and not cfg.get("sliding_window"):
        raise CheckpointError(f"{path}: sliding_attention layers without a sliding_window")


def _parse(cfg: dict, path: Path) -> ZlabConfig:
    n_layer, n_embd = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    rope = cfg.get("rope_parameters") or {}
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    n_target = cfg.get("num_target_layers")
    ids = _draft(cfg, "target_layer_ids")
    if ids is None:
        if n_target is None:
            raise CheckpointError(f"{path}: neither target_layer_ids nor num_target_layers is given")
        ids = build_target_layer_ids(int(n_target), n_layer)
    mask = _draft(cfg, "mask_token_id")
    if mask is None:
        raise CheckpointError(f"{path}: no mask_token_id (dflash_config.mask_token_id)")
    scale = _draft(cfg, "input_embedding_scale")
    cap = _draft(cfg, "final_logit_softcapping")
    mult = _draft(cfg, "output_multiplier")
    return ZlabConfig(
        path=path, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head), head_dim=head_dim,
        n_ff=int(cfg["intermediate_size"]), n_ctx=int(cfg.get("max_position_embeddings") or 32768),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_base=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        n_rot=None if partial == 1.0 else int(head_dim * partial),
        target_layer_ids=tuple(int(i) for i in ids), n_target_layers=None if n_target is None else int(n_target),
        mask_token_id=int(mask), block_size=int(_draft(cfg, "block_size", 16)),
        hidden_act=ACTIVATIONS[cfg.get("hidden_act", "silu")],
        vocab_size=None if cfg.get("vocab_size") is None else int(cfg["vocab_size"]),
        embedding_scale=_unless(scale, 1.0), logit_softcap=_unless(cap, 0.0), logit_scale=_unless(mult, 1.0),
        name=str(cfg.get("_name_or_path") or path.parent.name), **_sliding(cfg),
    )


def _sliding(cfg: dict) -> dict:
    """Sliding layers as z-lab's Qwen3DFlashAttention reads them: from layer_types, causal unless is_causal is set."""
    swa = tuple(t == "sliding_attention" for t in cfg.get("layer_types") or [])
    if not any(swa):
        return {}
    if len(swa) != int(cfg["num_hidden_layers"]):
        raise ValueError(f"layer_types names {len(swa)} layers, not num_hidden_layers")
    return {"sliding_window": int(cfg["sliding_window"]), "swa_layers": swa,
            "causal_swa": cfg.get("is_causal", _draft(cfg, "causal")) is None}


def _unless(value, neutral: float) -> float | None:
    """A float, or None where absent or equal to the value that changes nothing."""
    if value is None or math.isclose(float(value), neutral):
        return None
    return float(value)


def check_against_target(cfg: ZlabConfig, target: GGUFMeta) -> None:
    """PairingError unless the drafter fits the target GGUF (its metadata only)."""
    arch = target.arch
    n_layer = target.get(f"{arch}.block_count")
    n_embd = target.get(f"{arch}.embedding_length")
    tokens = target.get("tokenizer.ggml.tokens")
    where = f"{cfg.path.parent.name} for {target.path.name}"
    if arch in ("dflash", "dflash-draft") or n_layer is None or n_embd is None or not tokens:
        raise PairingError(f"{target.path.name} is not a target model with a vocabulary (architecture {arch!r})")
    if cfg.n_embd != n_embd:
        raise PairingError(f"{where}: drafter hidden_size {cfg.n_embd} != target embedding_length {n_embd} "
                           "(a drafter shares its target's embeddings)")
    if cfg.n_target_layers is not None and cfg.n_target_layers != n_layer:
        raise PairingError(f"{where}: the drafter was trained on a {cfg.n_target_layers}-layer target; "
                           f"this {arch} target has {n_layer} layers")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < n_layer - 1]
    if bad:
        raise PairingError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} reach beyond the target's depth: "
                           f"ids must lie in 0..{n_layer - 2} for a {n_layer}-layer target (offending: {bad})")
    if not 0 <= cfg.mask_token_id < len(tokens):
        raise PairingError(f"{where}: mask_token_id {cfg.mask_token_id} lies outside the target's vocabulary "
                           f"of {len(tokens)} tokens")
    if not MIN_BLOCK <= cfg.block_size <= MAX_BLOCK:
        raise PairingError(f"{where}: block_size {cfg.block_size} outside [{MIN_BLOCK}, {MAX_BLOCK}]")


def caveats(cfg: ZlabConfig, target: GGUFMeta) -> list[str]:
    """What converts, but not quite as z-lab's reference runs or describes it: one sentence each."""
    out = []
    tokens = target.get("tokenizer.ggml.tokens") or []
    if cfg.vocab_size is not None and cfg.vocab_size != len(tokens):
        # Gemma's GGUF drops out-of-vocabulary embedding rows, so only the mask id (checked) must agree
        out.append(f"config vocab_size {cfg.vocab_size} differs from the target's {len(tokens)} tokens")
    if cfg.causal_swa:
        swa = [i for i, s in enumerate(cfg.swa_layers) if s]
        out.append(f"layers {swa} are sliding_attention without is_causal, which z-lab's reference runs causally "
                   "inside the draft block; llama.cpp's dflash graph has one causal flag per context and runs them "
                   "non-causally: output stays exact, acceptance may fall short of z-lab's figures")
    return out

"""HF tensor name -> GGUF tensor name, per GGUF `general.architecture`.

The tables mirror what vendor/llama.cpp's converter writes:
  - gguf-py/gguf/tensor_mapping.py (TensorNameMap) for the generic names;
  - conversion/qwen.py `DFlashModel.filter_tensors` prefixes drafter names
    with "model.", so z-lab's `fc.weight` / `hidden_norm.weight` land on
    MODEL_TENSOR.FC ("fc") and ENC_OUTPUT_NORM ("enc.output_norm");
  - conversion/gemma.py: gemma2/3 keep `post_attention_layernorm` as a
    post-attention norm (ATTN_POST_NORM) and use `pre_feedforward_layernorm`
    as the pre-FFN norm.
The fork-era `dflash-draft` layout predates upstream support and used its own
names (`dflash_fc`, `dflash_hidden_norm`, `blk.N.post_attention_norm` as the
pre-FFN norm).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# Prefixes that wrap the text model in HF checkpoints (multimodal, drafters).
_HF_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")

_GLOBAL = {
    "embed_tokens": "token_embd",
    "lm_head": "output",
    "norm": "output_norm",
}

# Per-block module -> GGUF suffix (after "blk.N.").
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

_GEMMA2_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}

DRAFTER_ARCHS = ("dflash", "dflash-draft", "dflash_draft")


@dataclass(frozen=True)
class NameMap:
    arch: str
    top_level: dict[str, str]  # module name -> GGUF name, outside blocks
    layer: dict[str, str]
    is_drafter: bool
    note: str = ""  # shown in the report when the map is a fallback


def name_map_for(arch: str) -> NameMap:
    """The map for a GGUF architecture; unknown archs get the llama-style map."""
    if arch == "dflash":
        g = {**_GLOBAL, "fc": "fc", "hidden_norm": "enc.output_norm"}
        return NameMap(arch, g, dict(_LAYER), is_drafter=True)
    if arch in ("dflash-draft", "dflash_draft"):
        g = {**_GLOBAL, "fc": "dflash_fc", "hidden_norm": "dflash_hidden_norm"}
        layer = {**_LAYER, "post_attention_layernorm": "post_attention_norm"}
        return NameMap(arch, g, layer, is_drafter=True)
    if arch in ("gemma2", "gemma3", "gemma3_text"):
        return NameMap(arch, dict(_GLOBAL), {**_LAYER, **_GEMMA2_LAYER}, is_drafter=False)
    known = ("llama", "qwen2", "qwen3", "gemma", "mistral")
    note = "" if arch in known else f"no dedicated map for arch {arch!r}: used the llama-style map"
    return NameMap(arch, dict(_GLOBAL), dict(_LAYER), is_drafter=False, note=note)


def strip_prefix(hf_name: str) -> str:
    for p in _HF_PREFIXES:
        if hf_name.startswith(p):
            return hf_name[len(p):]
    return hf_name


_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def to_gguf(hf_name: str, m: NameMap) -> str | None:
    """GGUF name for an HF tensor, or None when no rule covers it."""
    base = strip_prefix(hf_name)
    module, dot, suffix = base.rpartition(".")
    if not dot or suffix not in ("weight", "bias"):
        return None
    if module in m.top_level:
        return f"{m.top_level[module]}.{suffix}"
    hit = _LAYER_RE.match(module)
    if hit and hit.group(2) in m.layer:
        return f"blk.{hit.group(1)}.{m.layer[hit.group(2)]}.{suffix}"
    return None


def is_shared(hf_name: str, m: NameMap) -> bool:
    """True for tensors a GGUF may legitimately omit.

    A drafter borrows the target's embeddings and head; any model with tied
    embeddings drops lm_head (llama.cpp reuses token_embd as the output).
    """
    module = strip_prefix(hf_name).rpartition(".")[0]
    if module == "lm_head":
        return True
    return m.is_drafter and module == "embed_tokens"


def is_generated(gguf_name: str, m: NameMap) -> bool:
    """GGUF tensors the converter makes without a source tensor."""
    if gguf_name.startswith("rope_freqs"):
        return True
    # conversion/qwen.py DFlashModel copies token_embd/output from the target; a reduced head adds d2t, the map
    # from its rows to target ids (scripts/reduce_drafter_head.py, pydflash-convert-drafter --head-ids).
    return m.is_drafter and gguf_name in ("token_embd.weight", "output.weight", "d2t")

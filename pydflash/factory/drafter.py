"""Tiny random DFlash drafters, one set of weights written in three layouts.

1. z-lab / HF checkpoint (what training produces): ``model.safetensors`` + ``config.json``
       fc.weight [n_embd, n_target_layers*n_embd]      hidden_norm.weight   norm.weight
       layers.N.input_layernorm.weight                 layers.N.post_attention_layernorm.weight
       layers.N.self_attn.{q,k,v,o}_proj.weight        layers.N.self_attn.{q,k}_norm.weight
       layers.N.mlp.{gate,up,down}_proj.weight
   config.json is Qwen3-style with ``dflash_config`` = {target_layer_ids (raw HF ids),
   mask_token_id, block_size, input_embedding_scale, and final_logit_softcapping where the
   target caps (gemma4)}.

2. Upstream llama.cpp GGUF (``general.architecture = "dflash"``), exactly what
   conversion/qwen.py DFlashModel emits and src/models/dflash.cpp loads:
       fc.weight, enc.output_norm.weight (= hidden_norm), output_norm.weight (= norm),
       blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm,
              ffn_norm (= post_attention_layernorm), ffn_gate, ffn_up, ffn_down}.weight
       dflash.target_layers   = HF target_layer_ids + 1  (layer-INPUT indices; required)
       dflash.block_size, tokenizer.ggml.mask_token_id, the usual dflash.* hparams,
       dflash.embedding_scale only when asked (the product's compat layer supplies it for
       Gemma targets through kv_overrides; writing it too would double-scale).
   No token_embd / output: the drafter borrows them from the target via ctx_other.
   Rope is NEOX (llama_model_rope_type) like the HF Qwen3 drafter, so q/k are NOT permuted:
   the safetensors [out, in] arrays go into GGUF unchanged.

3. Fork-era GGUF (``general.architecture = "dflash-draft"``, docs/compat.md),
   which stock llama.cpp cannot load:
       dflash_fc.weight, dflash_hidden_norm.weight, output_norm.weight,
       blk.N.post_attention_norm.weight as the pre-FFN norm (no ffn_norm), other blk.N.* as (2)
       dflash-draft.{context_length, embedding_length, block_count, feed_forward_length,
                     attention.head_count, attention.head_count_kv, attention.key_length,
                     attention.value_length, attention.layer_norm_rms_epsilon, rope.freq_base}
       dflash-draft.dflash.block_size         u32
       dflash-draft.dflash.target_layer_ids   i32 array, RAW HF ids (post-layer-output convention)
       dflash-draft.dflash.n_target_layers    u32
       dflash-draft.dflash.n_target_features  u32 = n_target_layers * n_embd
       dflash-draft.dflash.mask_token_id      u32 (also tokenizer.ggml.mask_token_id)
   The dflash-draft.dflash.* spellings follow published fork loaders (e.g. lucebox's
   load_draft_gguf reads "<arch>.dflash.target_layer_ids" as an INT32 array).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

from ..tools.compare.names import name_map_for, to_gguf
from . import weights as W
from .targets import TargetSpec
from .tokenizer import TinyVocab, add_vocab


@dataclass(frozen=True)
class DrafterSpec:
    n_layer: int
    n_embd: int  # = target n_embd (fc projects target features into the same width)
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int
    rms_eps: float
    rope_base: float
    target_layer_ids: tuple[int, ...]  # raw HF ids: output of layer i
    n_target_layers: int  # layers in the target (HF num_target_layers)
    mask_token_id: int
    n_vocab: int
    input_embedding_scale: float  # 1.0, or sqrt(n_embd) for Gemma targets
    block_size: int = 16
    logit_softcap: float | None = None  # the target's final logit softcap; z-lab's config carries it for Gemma-4

    def __post_init__(self) -> None:
        if self.n_layer < 1:
            raise ValueError("drafter needs at least one layer")
        if not self.target_layer_ids or any(not 0 <= i < self.n_target_layers for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids {self.target_layer_ids} out of range for {self.n_target_layers} layers")

    @property
    def layer_inputs(self) -> tuple[int, ...]:
        """What upstream GGUF stores: the input of layer i+1 is the output of layer i."""
        return tuple(i + 1 for i in self.target_layer_ids)


def pick_target_layer_ids(n_layer: int) -> tuple[int, ...]:
    """Spread over the target: first, middle, second-to-last (HF ids, deduplicated)."""
    return tuple(sorted({0, n_layer // 2, n_layer - 2}))


def drafter_spec(target: TargetSpec, n_layer: int, vocab: TinyVocab) -> DrafterSpec:
    return DrafterSpec(
        n_layer=n_layer, n_embd=target.n_embd, n_head=target.n_head, n_head_kv=target.n_head_kv,
        head_dim=target.head_dim, n_ff=target.n_ff, n_ctx=target.n_ctx, rms_eps=target.rms_eps,
        rope_base=target.rope_base, target_layer_ids=pick_target_layer_ids(target.n_layer),
        n_target_layers=target.n_layer, mask_token_id=vocab.mask_id, n_vocab=vocab.n_vocab,
        input_embedding_scale=target.embedding_scale, logit_softcap=target.logit_softcap,
    )


def drafter_plan(spec: DrafterSpec) -> list[W.Planned]:
    """Every tensor of the drafter (HF names, [out, in] orientation) in generation order."""
    e, hd = spec.n_embd, spec.head_dim
    plan = [W.Planned("fc.weight", (e, len(spec.target_layer_ids) * e), "matrix"),
            W.Planned("hidden_norm.weight", (e,), "norm"), W.Planned("norm.weight", (e,), "norm")]

    def add(name: str, shape: tuple[int, ...], kind: str = "matrix") -> None:
        plan.append(W.Planned(name, shape, kind))

    for i in range(spec.n_layer):
        p = f"layers.{i}."
        add(p + "input_layernorm.weight", (e,), "norm")
        add(p + "self_attn.q_proj.weight", (spec.n_head * hd, e))
        add(p + "self_attn.k_proj.weight", (spec.n_head_kv * hd, e))
        add(p + "self_attn.v_proj.weight", (spec.n_head_kv * hd, e))
        add(p + "self_attn.o_proj.weight", (e, spec.n_head * hd))
        add(p + "self_attn.q_norm.weight", (hd,), "norm")
        add(p + "self_attn.k_norm.weight", (hd,), "norm")
        add(p + "post_attention_layernorm.weight", (e,), "norm")
        add(p + "mlp.gate_proj.weight", (spec.n_ff, e))
        add(p + "mlp.up_proj.weight", (spec.n_ff, e))
        add(p + "mlp.down_proj.weight", (e, spec.n_ff))
    return plan


def drafter_weights(spec: DrafterSpec, rng: np.random.Generator, dtype: str) -> dict[str, np.ndarray]:
    """HF name -> array, [out, in] orientation, generated in a fixed order."""
    return W.materialize(drafter_plan(spec), rng, dtype)


def gguf_name(hf_name: str, layout: str) -> str:
    """HF tensor name -> GGUF name for layout "upstream" or "fork" (one name map, shared with compare-weights)."""
    name = to_gguf(hf_name, name_map_for("dflash-draft" if layout == "fork" else "dflash"))
    if name is None:
        raise ValueError(f"no GGUF name for drafter tensor {hf_name}")
    return name


def _add_hparams(w: gguf.GGUFWriter, arch: str, spec: DrafterSpec, dtype: str) -> None:
    w.add_name(f"pydflash-tiny-{arch}")
    w.add_file_type(W.file_type(dtype))
    w.add_uint32(f"{arch}.context_length", spec.n_ctx)
    w.add_uint32(f"{arch}.embedding_length", spec.n_embd)
    w.add_uint32(f"{arch}.block_count", spec.n_layer)
    w.add_uint32(f"{arch}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{arch}.attention.head_count", spec.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", spec.head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_float32(f"{arch}.rope.freq_base", spec.rope_base)


def _finish(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], layout: str, dtype: str) -> None:
    for hf_name, arr in tensors.items():
        w.add_tensor(gguf_name(hf_name, layout), W.storage(arr, dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_drafter_gguf(
    path: Path, spec: DrafterSpec, vocab: TinyVocab, tensors: dict[str, np.ndarray], dtype: str,
    embedding_scale: float | None = None,
) -> None:
    """Upstream layout. embedding_scale=None writes no dflash.embedding_scale key."""
    w = gguf.GGUFWriter(str(path), "dflash")
    add_drafter_keys(w, spec, vocab, dtype, embedding_scale)
    _finish(w, tensors, "upstream", dtype)


def add_drafter_keys(w: gguf.GGUFWriter, spec: DrafterSpec, vocab: TinyVocab, dtype: str,
                     embedding_scale: float | None = None) -> None:
    """The upstream layout's keys (arch "dflash")."""
    _add_hparams(w, "dflash", spec, dtype)
    w.add_uint32("dflash.block_size", spec.block_size)
    w.add_array("dflash.target_layers", list(spec.layer_inputs))
    if embedding_scale is not None:
        w.add_float32("dflash.embedding_scale", float(embedding_scale))
    add_vocab(w, vocab)


def write_drafter_fork_gguf(
    path: Path, spec: DrafterSpec, vocab: TinyVocab, tensors: dict[str, np.ndarray], dtype: str
) -> None:
    """Fork-era layout (see module docstring); raw HF target_layer_ids."""
    arch = "dflash-draft"
    w = gguf.GGUFWriter(str(path), arch)
    _add_hparams(w, arch, spec, dtype)
    w.add_uint32(f"{arch}.dflash.block_size", spec.block_size)
    w.add_array(f"{arch}.dflash.target_layer_ids", np.asarray(spec.target_layer_ids, dtype=np.int32).tolist())
    w.add_uint32(f"{arch}.dflash.n_target_layers", len(spec.target_layer_ids))
    w.add_uint32(f"{arch}.dflash.n_target_features", len(spec.target_layer_ids) * spec.n_embd)
    w.add_uint32(f"{arch}.dflash.mask_token_id", spec.mask_token_id)
    add_vocab(w, vocab)
    _finish(w, tensors, "fork", dtype)


def hf_config(spec: DrafterSpec, dtype: str) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": spec.n_embd,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.n_ff,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_base,
        "vocab_size": spec.n_vocab,
        "max_position_embeddings": spec.n_ctx,
        "tie_word_embeddings": False,
        "torch_dtype": "float16" if dtype == "f16" else "float32",
        "block_size": spec.block_size,
        "num_target_layers": spec.n_target_layers,
        "dflash_config": {
            "target_layer_ids": list(spec.target_layer_ids),
            "mask_token_id": spec.mask_token_id,
            "block_size": spec.block_size,
            "input_embedding_scale": spec.input_embedding_scale,
            # written only where the target caps: z-lab's compute_logits then caps the drafter's logits too
            **({"final_logit_softcapping": spec.logit_softcap} if spec.logit_softcap else {}),
        },
    }


def write_drafter_hf(
    st_path: Path, config_path: Path, spec: DrafterSpec, tensors: dict[str, np.ndarray], dtype: str
) -> None:
    np_dtype = np.float16 if dtype == "f16" else np.float32  # HF checkpoints use one dtype throughout
    save_file({k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in tensors.items()},
              str(st_path), metadata={"format": "pt"})
    config_path.write_text(json.dumps(hf_config(spec, dtype), indent=2, sort_keys=True) + "\n")

"""Write a z-lab DFlash checkpoint as the upstream ``dflash`` GGUF the pinned llama.cpp loads.

What is written is what vendor/llama.cpp's own converter (conversion/qwen.py ``DFlashModel``) writes for a DFlash-1
drafter: the Qwen3 hparams under ``dflash.*``, ``dflash.block_size``, ``dflash.target_layers`` = HF ids + 1 (layer
inputs), ``tokenizer.ggml.mask_token_id``, and ``dflash.embedding_scale`` / ``final_logit_softcapping`` /
``logit_scale`` where the config states them; tensors named by the map pydflash-compare-weights checks
(``fc``, ``enc.output_norm`` = hidden_norm, ``output_norm`` = norm, ``blk.N.*``). Two differences, on purpose:

- the tokenizer keys are copied from the target GGUF, not rebuilt from a Hugging Face folder: the pairing check
  hashes them, so a target converted by another llama.cpp version still matches, and no HF target folder (nor
  torch) is needed;
- tensors are streamed one at a time from the safetensors memory map: a 3 GB drafter needs no 3 GB of RAM.

Rope is NeoX in both z-lab's code and llama.cpp's dflash graph, so q/k are not permuted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from ..tools.compare.names import name_map_for, strip_prefix, to_gguf
from ..tools.compare.source import SafetensorsSource, SourceTensor, to_f32
from .gguf_meta import GGUFMeta
from .zlab import CheckpointError, ZlabConfig

Q = gguf.GGMLQuantizationType
OUTTYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16}  # plus "auto": the checkpoint's own float type
_SRC = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16}
_FILE_TYPE = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.F16: gguf.LlamaFileType.MOSTLY_F16,
              Q.BF16: gguf.LlamaFileType.MOSTLY_BF16}
_BORROWED = ("embed_tokens.", "lm_head.")  # a drafter uses its target's; skipped where a checkpoint ships them
_LAYER = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
          "mlp.down_proj")


@dataclass(frozen=True)
class Planned:
    gguf_name: str
    src: SourceTensor
    qtype: gguf.GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.src.shape, dtype=np.int64)) * (4 if self.qtype == Q.F32 else 2)


def expected_shapes(cfg: ZlabConfig) -> dict[str, tuple[int, ...]]:
    """HF name (without a ``model.`` prefix) -> [out, in] shape, every tensor a DFlash-1 drafter must have."""
    e, hd, ff = cfg.n_embd, cfg.head_dim, cfg.n_ff
    q, kv = cfg.n_head * hd, cfg.n_head_kv * hd
    t: dict[str, tuple[int, ...]] = {"fc.weight": (e, len(cfg.target_layer_ids) * e), "hidden_norm.weight": (e,),
                                     "norm.weight": (e,)}
    shapes = ((e,), (q, e), (kv, e), (kv, e), (e, q), (hd,), (hd,), (e,), (ff, e), (ff, e), (e, ff))
    for i in range(cfg.n_layer):
        t.update({f"layers.{i}.{m}.weight": s for m, s in zip(_LAYER, shapes)})
    return t


def plan(cfg: ZlabConfig, source: SafetensorsSource, outtype: str = "auto") -> list[Planned]:
    """The tensors to write, in order; CheckpointError for a missing, unexpected or misshapen one."""
    where = cfg.path.parent
    by_name = {strip_prefix(n): t for n, t in source.tensors.items()}
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in by_name]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{where}: checkpoint lacks {len(missing)} tensor(s) a DFlash drafter needs: "
                              f"{', '.join(missing[:3])}{more}")
    extra = sorted(n for n in by_name if n not in want and not n.startswith(_BORROWED))
    if extra:
        raise CheckpointError(f"{where}: unexpected tensor(s) {', '.join(extra[:3])}: not a DFlash-1 drafter "
                              f"with {cfg.n_layer} layers?")
    nmap, out = name_map_for("dflash"), []
    for name, shape in want.items():
        src = by_name[name]
        if tuple(src.shape) != shape:
            hint = f" ({len(cfg.target_layer_ids)} target layers x {cfg.n_embd})" if name == "fc.weight" else ""
            raise CheckpointError(f"{where}: {name} is {list(src.shape)}, config.json says {list(shape)}{hint}")
        if src.dtype not in _SRC:
            raise CheckpointError(f"{where}: {name} is {src.dtype}; only F32, F16 and BF16 checkpoints convert")
        qtype = Q.F32 if len(shape) == 1 else _SRC[src.dtype] if outtype == "auto" else OUTTYPES[outtype]
        out.append(Planned(to_gguf(name, nmap), src, qtype))
    return out


def write(cfg: ZlabConfig, target: GGUFMeta, source: SafetensorsSource, tensors: list[Planned], out: Path) -> Path:
    """Write the GGUF to ``out`` (through a temporary file next to it, replaced at the end)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    matrix_types = {p.qtype for p in tensors if len(p.src.shape) > 1}
    try:
        w = gguf.GGUFWriter(str(tmp), "dflash")
        _add_keys(w, cfg, target, _FILE_TYPE[next((q for q in matrix_types if q != Q.F32), Q.F32)])
        for p in tensors:
            dtype = np.float32 if p.qtype == Q.F32 else np.float16 if p.qtype == Q.F16 else np.uint16
            w.add_tensor_info(p.gguf_name, p.src.shape, np.dtype(dtype), p.nbytes, raw_dtype=p.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in tensors:  # one tensor in memory at a time
            w.write_tensor_data(_converted(source, p))
        w.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _converted(source: SafetensorsSource, p: Planned) -> np.ndarray:
    raw = source.array(p.src)
    if _SRC[p.src.dtype] == p.qtype:
        return np.ascontiguousarray(raw)  # the checkpoint's own bytes
    f32 = to_f32(raw, p.src.dtype)
    if p.qtype == Q.F32:
        return f32
    if p.qtype == Q.BF16:
        return gguf.quants.quantize(f32, Q.BF16)
    f16 = f32.astype(np.float16)
    if not np.isfinite(f16).all() and np.isfinite(f32).all():
        raise CheckpointError(f"{p.src.name} overflows F16; convert with --outtype bf16 or f32")
    return f16


def _add_keys(w: gguf.GGUFWriter, cfg: ZlabConfig, target: GGUFMeta, file_type: int) -> None:
    w.add_name(cfg.name)
    w.add_file_type(int(file_type))
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_base)
    if cfg.n_rot is not None:
        w.add_rope_dimension_count(cfg.n_rot)
    if cfg.hidden_act != "silu":  # dflash.cpp's default
        w.add_string("dflash.hidden_activation", cfg.hidden_act)
    if cfg.swa_layers:
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern(list(cfg.swa_layers))
    w.add_uint32("dflash.block_size", cfg.block_size)
    w.add_array("dflash.target_layers", [int(i) for i in cfg.layer_inputs])
    for key, value in (("dflash.embedding_scale", cfg.embedding_scale),
                       ("dflash.final_logit_softcapping", cfg.logit_softcap), ("dflash.logit_scale", cfg.logit_scale)):
        if value is not None:
            w.add_float32(key, value)
    for key, value in target.kv.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.mask_token_id":
            vtype, etype = target.types[key]
            w.add_key_value(key, value, gguf.GGUFValueType(vtype),
                            sub_type=gguf.GGUFValueType(etype) if etype is not None else None)
    w.add_uint32("tokenizer.ggml.mask_token_id", cfg.mask_token_id)

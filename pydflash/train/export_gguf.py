"""Write a drafter (z-lab safetensors + config.json) as an upstream llama.cpp ``dflash`` GGUF.

Layout follows src/models/dflash.cpp and conversion/qwen.py ``DFlashModel``:
- ``general.architecture = dflash``; Qwen3 backbone hparams under ``dflash.*``;
- ``dflash.target_layers`` = HF ``target_layer_ids`` + 1 (layer-input convention);
- ``dflash.block_size``, ``dflash.embedding_scale`` (noise embeddings, sqrt(n_embd) for Gemma),
  ``dflash.attention.causal = false``, ``tokenizer.ggml.mask_token_id``;
- the target's full tokenizer metadata is copied; no token_embd/output tensors: the drafter
  borrows them from the target through ``ctx_other``.

    python -m pydflash.train.export_gguf --drafter DIR --target TARGET.gguf --out X.gguf --type q8_0
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

ARCH = "dflash"

# z-lab (HF) name -> GGUF name; {i} is the layer
NAMES = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    parts = hf.split(".")
    if parts[0] == "layers":
        key = ".".join(["layers", "{i}"] + parts[2:])
        return NAMES[key].format(i=parts[1])
    return NAMES[hf]


def _copy_tokenizer(writer, target_path: str) -> None:
    import gguf

    reader = gguf.GGUFReader(target_path)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == "tokenizer.ggml.mask_token_id":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            val = field.contents()
            writer.add_key_value(key, val, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, field.contents(), vtype)


def write(drafter_dir: str, target_path: str, out: str, qtype: str = "q8_0") -> str:
    import gguf
    from safetensors.torch import load_file

    with open(os.path.join(drafter_dir, "config.json")) as f:
        cfg = json.load(f)
    dc = cfg["dflash_config"]
    tensors = {k: v.float().numpy() for k, v in load_file(os.path.join(drafter_dir, "model.safetensors")).items()}

    w = gguf.GGUFWriter(out, ARCH)
    w.add_string("general.name", "pydflash Gemma-3-270M DFlash drafter")
    w.add_string("general.license", "gemma")
    w.add_uint32(f"{ARCH}.context_length", int(cfg.get("max_position_embeddings", 32768)))
    w.add_uint32(f"{ARCH}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{ARCH}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{ARCH}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{ARCH}.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(f"{ARCH}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_uint32(f"{ARCH}.attention.key_length", cfg["head_dim"])
    w.add_uint32(f"{ARCH}.attention.value_length", cfg["head_dim"])
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{ARCH}.rope.freq_base", cfg["rope_theta"])
    w.add_uint32(f"{ARCH}.vocab_size", cfg["vocab_size"])
    w.add_bool(f"{ARCH}.attention.causal", False)
    w.add_uint32(f"{ARCH}.block_size", dc["block_size"])
    w.add_float32(f"{ARCH}.embedding_scale", float(dc["input_embedding_scale"]))
    w.add_array(f"{ARCH}.target_layers", [int(i) + 1 for i in dc["target_layer_ids"]])
    w.add_uint32(gguf.Keys.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION)
    w.add_uint32("general.file_type", 7 if qtype == "q8_0" else 1)
    _copy_tokenizer(w, target_path)
    w.add_uint32("tokenizer.ggml.mask_token_id", int(dc["mask_token_id"]))

    for name in sorted(tensors):
        data = tensors[name].astype(np.float32)
        gname = gguf_name(name)
        if data.ndim == 2 and qtype == "q8_0" and data.shape[1] % 32 == 0:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif data.ndim == 2:
            w.add_tensor(gname, data.astype(np.float16))
        else:
            w.add_tensor(gname, data)  # norms stay f32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True, help="dir with model.safetensors + config.json")
    ap.add_argument("--target", required=True, help="target GGUF (tokenizer metadata is copied)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=["q8_0", "f16"], default="q8_0")
    a = ap.parse_args(argv)
    print(write(a.drafter, a.target, a.out, a.type))


if __name__ == "__main__":
    main()

"""pydflash-compare-weights: inventory, per-type error bands, exit codes.

Fixtures are a tiny dflash drafter in z-lab's HF names, written as safetensors
by hand (so bf16 works without torch) and converted to GGUF with gguf-py's
GGUFWriter. K-quants come from the vendored llama.cpp's llama_model_quantize (pydflash.native.quantize).
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from pydflash.tools.compare import compare, render_table
from pydflash.tools.compare.names import name_map_for, to_gguf

REPO = Path(__file__).resolve().parents[2]


HIDDEN, INTER, N_HEAD, N_KV, HEAD_DIM, VOCAB = 256, 512, 2, 1, 128, 64

# Drafter tensors, HF z-lab names, numpy shapes.
SHAPES = {
    "fc.weight": (HIDDEN, 2 * HIDDEN),
    "hidden_norm.weight": (HIDDEN,),
    "norm.weight": (HIDDEN,),
    "embed_tokens.weight": (VOCAB, HIDDEN),  # borrowed from the target: "shared"
    "layers.0.input_layernorm.weight": (HIDDEN,),
    "layers.0.self_attn.q_proj.weight": (N_HEAD * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.k_proj.weight": (N_KV * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.v_proj.weight": (N_KV * HEAD_DIM, HIDDEN),
    "layers.0.self_attn.o_proj.weight": (HIDDEN, N_HEAD * HEAD_DIM),
    "layers.0.self_attn.q_norm.weight": (HEAD_DIM,),
    "layers.0.self_attn.k_norm.weight": (HEAD_DIM,),
    "layers.0.post_attention_layernorm.weight": (HIDDEN,),
    "layers.0.mlp.gate_proj.weight": (INTER, HIDDEN),
    "layers.0.mlp.up_proj.weight": (INTER, HIDDEN),
    "layers.0.mlp.down_proj.weight": (HIDDEN, INTER),
}


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in SHAPES.items():
        if len(shape) == 1:  # norms sit near 1, like trained RMSNorm weights
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Minimal safetensors writer: u64 header length, JSON header, raw data."""
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        raw = bf16_bits(arr) if dtype == "BF16" else arr.astype({"F32": "<f4", "F16": "<f2"}[dtype])
        b = raw.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def as_gguf(weights: dict[str, np.ndarray], arch: str = "dflash") -> dict[str, np.ndarray]:
    """HF-named weights -> GGUF-named, minus what a drafter GGUF leaves to the target."""
    m = name_map_for(arch)
    return {to_gguf(k, m): v for k, v in weights.items() if k != "embed_tokens.weight"}


def write_gguf(path: Path, tensors: dict[str, np.ndarray], qtype: str = "F32", arch: str = "dflash") -> Path:
    """GGUF-named tensors as llama.cpp's converter lays them out: 2-D in `qtype`, norms in F32."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    if arch == "dflash":  # llama.cpp's dflash loader (and so llama-quantize) requires it
        w.add_array("dflash.target_layers", [1, 2])
    for name, arr in tensors.items():
        _add(w, name, arr, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: str) -> None:
    if arr.ndim == 1 or qtype == "F32":
        w.add_tensor(name, arr.astype(np.float32))
    elif qtype == "F16":
        w.add_tensor(name, arr.astype(np.float16))
    else:
        t = gguf.GGMLQuantizationType[qtype]
        # gguf/quants.py quantize(): numpy port of ggml's quantize_row_*_ref
        w.add_tensor(name, gguf.quants.quantize(arr, t), raw_dtype=t)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pydflash.cli.compare_weights", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def by_gguf_name(report) -> dict:
    return {t.gguf_name: t for t in report.tensors}


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return make_weights()


@pytest.fixture(scope="module")
def src(tmp_path_factory, weights) -> Path:
    path = tmp_path_factory.mktemp("src") / "model.safetensors"
    write_safetensors(path, weights)
    return path


# --- error bands -----------------------------------------------------------------

# (low, high) rel RMS of a clean conversion of N(0, 0.02) weights. The low bound
# proves the type really was quantized.
BANDS = {"F16": (1e-5, 3e-4), "Q8_0": (2e-3, 1e-2), "Q6_K": (4e-3, 2e-2), "Q4_K": (3e-2, 8e-2)}


def check_band(report, qtype: str) -> None:
    typed = [t for t in report.tensors if t.gguf_type == qtype]
    assert typed, f"no {qtype} tensor in the GGUF"
    lo, hi = BANDS[qtype]
    for t in typed:
        assert lo < t.rel_rms < hi, (t.gguf_name, t.rel_rms)
        assert t.cosine > 0.99 and t.status == "ok"
    assert report.exit_code == 0, render_table(report)


def test_f32_round_trip_is_exact(tmp_path, src, weights):
    g = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    report = compare(src, g)
    assert all(t.rel_rms == 0.0 and t.max_abs == 0.0 for t in report.tensors if t.rel_rms is not None)
    assert report.counts() == {"ok": 14, "shared": 1}
    proc = run_cli(src, g)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: OK" in proc.stdout


def test_f16_within_fp16_rounding(tmp_path, src, weights):
    report = compare(src, write_gguf(tmp_path / "f16.gguf", as_gguf(weights), "F16"))
    check_band(report, "F16")
    for t in report.tensors:
        if t.gguf_type == "F16":  # round-to-nearest: at most half an fp16 ulp of the largest value
            assert t.max_abs <= np.abs(weights[t.hf_name]).max() * 2.0 ** -11


def test_q8_0_band(tmp_path, src, weights):
    check_band(compare(src, write_gguf(tmp_path / "q8.gguf", as_gguf(weights), "Q8_0")), "Q8_0")


@pytest.mark.parametrize("qtype", ["Q6_K", "Q4_K"])
def test_k_quant_bands(tmp_path, src, weights, qtype):
    from pydflash.native.quantize import quantize

    f32 = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    out = tmp_path / f"{qtype}.gguf"
    # pure: one type for every 2-D tensor instead of the Q4_K_M mixture
    quantize(f32, out, {"Q6_K": "Q6_K", "Q4_K": "Q4_K_M"}[qtype], pure=True)
    check_band(compare(src, out), qtype)
    assert run_cli(src, out).returncode == 0


# --- flagged and inventory problems ----------------------------------------------

def test_perturbed_tensor_is_flagged(tmp_path, src, weights):
    tensors = as_gguf(weights)
    rng = np.random.default_rng(1)
    up = tensors["blk.0.ffn_up.weight"]
    tensors["blk.0.ffn_up.weight"] = up + 0.2 * up.std() * rng.standard_normal(up.shape).astype(np.float32)
    g = write_gguf(tmp_path / "bad.gguf", tensors, "Q8_0")
    flagged = [t.gguf_name for t in compare(src, g).tensors if t.status == "flagged"]
    assert flagged == ["blk.0.ffn_up.weight"]
    proc = run_cli(src, g, "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["summary"]["counts"]["flagged"] == 1
    assert doc["summary"]["by_type"]["Q8_0"]["flagged"] == 1


def test_missing_renamed_and_wrong_shape_are_reported(tmp_path, src, weights):
    tensors = as_gguf(weights)
    del tensors["blk.0.attn_v.weight"]                                         # missing
    tensors["blk.0.attn_qq.weight"] = tensors.pop("blk.0.attn_q.weight")       # renamed
    tensors["blk.0.ffn_gate.weight"] = tensors["blk.0.ffn_gate.weight"][:256]  # wrong shape
    g = write_gguf(tmp_path / "inv.gguf", tensors, "F32")
    rows = by_gguf_name(compare(src, g))
    assert rows["blk.0.attn_v.weight"].status == "missing_in_gguf"
    assert rows["blk.0.attn_q.weight"].status == "missing_in_gguf"
    assert rows["blk.0.attn_qq.weight"].status == "extra_in_gguf"
    assert rows["blk.0.ffn_gate.weight"].status == "shape_mismatch"
    assert rows["token_embd.weight"].status == "shared"
    proc = run_cli(src, g)
    assert proc.returncode == 1
    assert "shape_mismatch (1):" in proc.stdout and "source [512, 256] vs gguf [256, 256]" in proc.stdout


def test_transposed_storage_is_reported_not_failed(tmp_path, src, weights):
    tensors = as_gguf(weights)
    tensors["fc.weight"] = np.ascontiguousarray(tensors["fc.weight"].T)
    report = compare(src, write_gguf(tmp_path / "t.gguf", tensors, "F32"))
    fc = by_gguf_name(report)["fc.weight"]
    assert (fc.status, fc.transform, fc.rel_rms) == ("ok", "transposed", 0.0)
    assert report.exit_code == 0 and any("transposed" in n for n in report.notes)


def test_unsupported_type_is_named(tmp_path, src, weights):
    g = tmp_path / "q8k.gguf"
    w = gguf.GGUFWriter(str(g), "dflash")
    raw = np.zeros((HIDDEN, 2 * HIDDEN // 256 * 292), dtype=np.uint8)  # Q8_K: 292 bytes per 256 values
    w.add_tensor("fc.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fc = by_gguf_name(compare(src, g, only="fc.weight"))["fc.weight"]
    assert (fc.status, fc.gguf_type) == ("unsupported", "Q8_K")
    assert "type Q8_K (gguf-py cannot dequantize it)" in run_cli(src, g, "--only", "fc.weight").stdout


# --- bad input: exit 2, one line, no traceback -------------------------------------

def assert_bad_input(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_truncated_gguf_exits_2(tmp_path, src, weights):
    g = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(g.read_bytes()[: g.stat().st_size // 2])
    assert_bad_input(run_cli(src, cut), "truncated")


def test_other_bad_inputs_exit_2(tmp_path, src, weights):
    g = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    assert_bad_input(run_cli(src, tmp_path / "nope.gguf"), "GGUF not found")
    assert_bad_input(run_cli(tmp_path / "nope.safetensors", g), "source not found")
    assert_bad_input(run_cli(src, src), "not a readable GGUF")
    assert_bad_input(run_cli(g, g), "not a readable safetensors")
    tol = tmp_path / "tol.json"
    tol.write_text("{not json")
    assert_bad_input(run_cli(src, g, "--tolerance-file", tol), "--tolerance-file")
    tol.write_text('{"Q8_0": "tight"}')
    assert_bad_input(run_cli(src, g, "--tolerance-file", tol), "non-negative number")


def test_tolerance_file_overrides_table(tmp_path, src, weights):
    g = write_gguf(tmp_path / "q8.gguf", as_gguf(weights), "Q8_0")
    tol = tmp_path / "tol.json"
    tol.write_text('{"Q8_0": 1e-4}')
    assert run_cli(src, g, "--tolerance-file", tol).returncode == 1


# --- source formats ------------------------------------------------------------------

def test_sharded_index_and_directory(tmp_path, weights):
    names = list(weights)
    shards = {"model-00001-of-00002.safetensors": names[:7], "model-00002-of-00002.safetensors": names[7:]}
    for fname, part in shards.items():
        write_safetensors(tmp_path / fname, {n: weights[n] for n in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {n: f for f, part in shards.items() for n in part}}))
    g = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    for source in (index, tmp_path):
        report = compare(source, g)
        assert report.counts() == {"ok": 14, "shared": 1} and report.exit_code == 0


def test_bf16_source(tmp_path, weights):
    src = tmp_path / "bf16.safetensors"
    write_safetensors(src, weights, "BF16")
    decoded = {k: (bf16_bits(v).astype(np.uint32) << 16).view(np.float32) for k, v in weights.items()}
    for qtype in ("F32", "BF16"):  # bf16 -> f32 and bf16 -> bf16 are both lossless
        report = compare(src, write_gguf(tmp_path / f"{qtype}.gguf", as_gguf(decoded), qtype))
        assert all(t.src_dtype == "BF16" for t in report.tensors)
        assert all(t.rel_rms == 0.0 for t in report.tensors if t.rel_rms is not None), render_table(report)
        assert report.exit_code == 0


# --- name maps and known transforms ---------------------------------------------------

def test_fork_dflash_draft_layout(tmp_path, src, weights):
    report = compare(src, write_gguf(tmp_path / "fork.gguf", as_gguf(weights, "dflash-draft"), "F32", "dflash-draft"))
    rows = by_gguf_name(report)
    assert {"dflash_fc.weight", "dflash_hidden_norm.weight", "blk.0.post_attention_norm.weight"} <= set(rows)
    assert report.exit_code == 0


def test_llama_qk_permutation_is_undone(tmp_path, src, weights):
    from pydflash.tools.compare.transforms import llama_permute_index
    target = {k: v for k, v in weights.items() if not k.startswith(("fc.", "hidden_norm"))}
    tensors = {to_gguf(k, name_map_for("llama")): v for k, v in target.items()}
    plain = write_gguf(tmp_path / "plain.gguf", tensors, "F32", "llama")
    for gname, heads in (("blk.0.attn_q.weight", N_HEAD), ("blk.0.attn_k.weight", N_KV)):
        tensors[gname] = tensors[gname][llama_permute_index(tensors[gname].shape[0], heads)]
    permuted = write_gguf(tmp_path / "perm.gguf", tensors, "F32", "llama")
    # A llama GGUF without the converter's permutation is exactly what the tool must catch.
    assert compare(src, plain, only="blk.0.attn_[qk].weight").exit_code == 1
    report = compare(src, permuted)
    q = by_gguf_name(report)["blk.0.attn_q.weight"]
    assert (q.status, q.transform, q.rel_rms) == ("ok", "llama q/k permute", 0.0)
    assert report.exit_code == 1  # fc/hidden_norm have no llama counterpart: unmapped
    assert {t.hf_name for t in report.tensors if t.status == "unmapped"} == {"fc.weight", "hidden_norm.weight"}


def test_llama_bias_permutation():
    from pydflash.tools.compare.transforms import llama_permute_index, pick_transform, source_rows
    bias = np.arange(2 * HEAD_DIM, dtype=np.float32)
    tf = pick_transform("llama", "model.layers.0.self_attn.q_proj.bias", (2 * HEAD_DIM,), (2 * HEAD_DIM,), (2, 2))
    want = bias[llama_permute_index(2 * HEAD_DIM, 2)]
    np.testing.assert_array_equal(source_rows(bias.reshape(1, -1), "F32", tf, 0, 1)[0], want)


def test_gemma_norm_plus_one(tmp_path, weights):
    src = tmp_path / "bf16.safetensors"
    hf = {k: v for k, v in weights.items() if not k.startswith(("fc.", "hidden_norm"))}
    hf = {("model." + k if k != "lm_head.weight" else k): v for k, v in hf.items()}
    write_safetensors(src, hf, "BF16")
    decoded = {k: (bf16_bits(v).astype(np.uint32) << 16).view(np.float32) for k, v in hf.items()}
    m = name_map_for("gemma3")
    tensors = {to_gguf(k, m): v for k, v in decoded.items()}
    for name in tensors:  # conversion/gemma.py: w + 1, computed in bf16
        if name.endswith("norm.weight"):
            tensors[name] = (bf16_bits(tensors[name] + 1).astype(np.uint32) << 16).view(np.float32)
    tensors["token_embd.weight"] = tensors["token_embd.weight"][:60]  # converter dropped OOV rows
    report = compare(src, write_gguf(tmp_path / "g.gguf", tensors, "F32", "gemma3"))
    assert report.exit_code == 0, render_table(report)
    assert by_gguf_name(report)["output_norm.weight"].transform == "norm w+1"
    assert by_gguf_name(report)["token_embd.weight"].transform == "vocab trimmed to 60 rows"
    assert by_gguf_name(report)["blk.0.post_attention_norm.weight"].hf_name.endswith("post_attention_layernorm.weight")
    assert any("w+1" in n for n in report.notes)


def test_only_filters_both_sides(tmp_path, src, weights):
    report = compare(src, write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32"), only="blk.0.ffn_")
    assert {t.gguf_name for t in report.tensors} == {f"blk.0.ffn_{x}.weight" for x in ("up", "down", "gate", "norm")}


def test_only_matching_nothing_is_bad_input(tmp_path, src, weights):
    g = write_gguf(tmp_path / "f32.gguf", as_gguf(weights), "F32")
    proc = run_cli(src, g, "--only", "blk.7.")
    assert_bad_input(proc, "--only 'blk.7.' matches no tensor")
    assert "result: OK" not in proc.stdout
    assert_bad_input(run_cli(src, g, "--only", "*nothing*"), "matches no tensor")


def test_factory_drafter_layouts_agree(tmp_path):
    """The tiny-model factory's z-lab safetensors match its upstream and fork-era GGUFs."""
    factory = pytest.importorskip("pydflash.factory")
    pair = factory.write_tiny_pair(tmp_path, arch="qwen3", seed=0)
    for g in (pair.drafter, pair.drafter_fork):
        report = compare(pair.safetensors, g)
        assert report.exit_code == 0, render_table(report)
        assert report.counts().get("ok", 0) >= 14

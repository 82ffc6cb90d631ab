"""Random-weight pairs of real shapes (pydflash.factory.scale): the Qwen3-4B / Qwen3-4B-DFlash-b16 figures, the
streamed writer, and the whole 4B path at a tenth of the width: the same writers, llama.cpp's Q4_K_M mix, the full
151,936-token vocabulary and z-lab's mask id, loaded by pydflash and run with synthetic acceptance. Also the
4B-scale benchmark's additions to scripts/bench/http_vs_native.py (its conditions, prompts and targets)."""

from __future__ import annotations

import os
import subprocess
import sys

import gguf
from gguf import GGMLQuantizationType as Q
import numpy as np
import pytest

from pydflash import api
from pydflash.compat.gguf_meta import read_metadata
from pydflash.config import EngineConfig
from pydflash.native.quantize import FTYPES
from pydflash.factory import drafter as D
from pydflash.factory import targets
from pydflash.factory import weights as W
from pydflash.factory.scale import QUANTS, write_scale_pair
from pydflash.factory.scale import main as scale_main
from pydflash.factory.shapes import QWEN3_4B, TINY_QWEN3_4B, zlab_target_layer_ids
from pydflash.factory.stream import planned_bytes, write_streamed
from pydflash.factory.tokenizer import CONTROL, build_padded_vocab, build_vocab
from tests.helpers.bench import load_bench


def _params(plan: list[W.Planned]) -> int:
    return sum(int(np.prod(p.shape)) for p in plan)


# --- the shapes (no native library) ---------------------------------------------------------------------------------
def test_qwen3_4b_and_its_drafter_have_the_published_sizes():
    """4.02 B target parameters (Qwen3-4B's model card: 4.0 B, 3.6 B without the tied embedding); the drafter's 58
    tensors and 537.4 M parameters are what pydflash-convert-drafter --dry-run reports for z-lab's checkpoint."""
    plan = targets.target_plan(QWEN3_4B.target, QWEN3_4B.n_vocab)
    assert _params(plan) == QWEN3_4B.target_params
    assert round(QWEN3_4B.target_params / 1e9, 2) == 4.02
    assert round((QWEN3_4B.target_params - 151_936 * 2560) / 1e9, 1) == 3.6
    assert "output.weight" not in {p.name for p in plan}  # tied: llama.cpp reads token_embd as the head
    d = QWEN3_4B.drafter()
    dplan = D.drafter_plan(d)
    assert (len(dplan), round(_params(dplan) / 1e6, 1)) == (58, 537.4)
    assert (d.target_layer_ids, d.layer_inputs) == ((1, 9, 17, 25, 33), (2, 10, 18, 26, 34))
    assert (d.mask_token_id, d.n_vocab, d.block_size, d.n_layer) == (151_669, 151_936, 16, 5)
    # F16 staging file of the target: ~8 GB (the disk check's figure)
    assert round(planned_bytes(plan, "f16") / 1e9, 1) == 8.0


@pytest.mark.parametrize("n_target, n_draft, ids", [
    (36, 5, [1, 9, 17, 25, 33]),  # z-lab/Qwen3-4B-DFlash-b16 and Qwen3-8B-DFlash-b16
    (64, 10, [1, 8, 14, 21, 28, 34, 41, 48, 54, 61]),  # a published Qwen3-32B DFlash config
    (28, 5, [1, 7, 13, 19, 25]),
    (36, 1, [18]),
])
def test_target_layer_ids_follow_dflash(n_target, n_draft, ids):
    assert list(zlab_target_layer_ids(n_target, n_draft)) == ids


def test_the_tiny_shape_keeps_what_the_code_path_depends_on():
    big, tiny = QWEN3_4B.target, TINY_QWEN3_4B.target
    assert (tiny.n_embd, tiny.n_head, tiny.n_head_kv, tiny.head_dim, tiny.n_ff, tiny.n_layer) == \
        (256, 8, 2, 64, 1024, 9)
    assert tiny.n_head // tiny.n_head_kv == big.n_head // big.n_head_kv == 4
    assert tiny.n_head * tiny.head_dim > tiny.n_embd  # q wider than the residual, as 4096 over 2560
    assert (TINY_QWEN3_4B.n_vocab, TINY_QWEN3_4B.mask_id, tiny.tied_output) == (151_936, 151_669, True)
    # every matrix row spans whole 256-value K-quant blocks, so Q4_K_M quantizes them as at full size
    for p in targets.target_plan(tiny, TINY_QWEN3_4B.n_vocab) + D.drafter_plan(TINY_QWEN3_4B.drafter()):
        assert len(p.shape) == 1 or p.shape[1] % 256 == 0, p.name
    d = TINY_QWEN3_4B.drafter()
    assert d.n_layer == 5 and d.target_layer_ids == (1, 2, 4, 5, 6) and max(d.layer_inputs) < tiny.n_layer


def test_the_padded_vocabulary():
    base = build_vocab()
    v = build_padded_vocab(151_936, 151_669)
    assert v.n_vocab == 151_936 and v.tokens[:base.n_vocab] == base.tokens and len(set(v.tokens)) == v.n_vocab
    assert (v.mask_id, v.types[151_669], v.tokens[151_669]) == (151_669, CONTROL, "<|MASK|>")
    with pytest.raises(ValueError):
        build_padded_vocab(1000, 5)  # the mask must not take a piece of the tiny vocabulary ...
    g = build_padded_vocab(262_144, 4)  # ... but may be its own <mask> at 4, where Gemma's drafters have it
    assert (g.mask_id, g.tokens[4], g.n_vocab) == (4, "<mask>", 262_144) and "<|MASK|>" not in g.tokens


def test_the_streamed_writer_writes_what_the_tiny_writer_writes(tmp_path):
    """write_streamed (one tensor in memory at a time) and the eager writer give the same tensors and keys."""
    spec = targets.default_spec("qwen3")
    vocab = build_vocab()
    plan = targets.target_plan(spec, vocab.n_vocab)
    write_streamed(tmp_path / "streamed.gguf", "qwen3", lambda w: targets.add_target_keys(w, spec, vocab, "f16"),
                   plan, W.rng_for(5, 0), "f16")
    eager = {k: W.storage(v, "f16") for k, v in targets.target_weights(spec, W.rng_for(5, 0), vocab.n_vocab,
                                                                        "f32").items()}
    targets.write_target(tmp_path / "eager.gguf", spec, vocab, eager, "f16")
    a, b = gguf.GGUFReader(tmp_path / "streamed.gguf"), gguf.GGUFReader(tmp_path / "eager.gguf")
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors] == [p.name for p in plan]
    for x, y in zip(a.tensors, b.tensors):
        assert x.tensor_type == y.tensor_type and np.array_equal(np.array(x.data), np.array(y.data)), x.name
    assert {k: f.contents() for k, f in a.fields.items()} == {k: f.contents() for k, f in b.fields.items()}


# --- the whole path on the tiny shape -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny4b(tmp_path_factory):
    """The F16 files first, in a process without libllama (the device writes them while llama.cpp is still being
    built), then the quantized pair from them."""
    out = tmp_path_factory.mktemp("tiny4b")
    env = {**os.environ, "PYDFLASH_LIB_DIR": str(out / "no-build-yet")}
    code = ("import sys; from pydflash.factory.scale import main; main(sys.argv[1:]); "
            "print('libllama loaded' if 'pydflash.native._lib' in sys.modules else 'no libllama')")
    r = subprocess.run([sys.executable, "-c", code, str(out), "--shape", "tiny-qwen3-4b", "--f16-only"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("no libllama"), r.stdout + r.stderr
    staged = out / ".f16-tiny-qwen3-4b-0" / "target-f16.gguf"
    assert staged.is_file()
    pair = write_scale_pair(out, "tiny-qwen3-4b", quants=("Q4_K_M",), seed=0)
    assert not staged.parent.exists()  # quantized from the staged files, which are then deleted
    return pair


def test_the_quantizer_names_are_the_native_ones():
    assert QUANTS == tuple(FTYPES)


def test_tiny_4b_files_are_quantized_as_llama_quantize_would(tiny4b):
    def types(path):
        meta = read_metadata(path)
        return meta, {name: Q(t.ggml_type).name for name, t in meta.tensors.items()}

    _, t = types(tiny4b.targets["Q4_K_M"])
    assert "output.weight" not in t and t["token_embd.weight"] == "Q6_K"  # tied: the embedding is the head
    assert t["blk.0.attn_q.weight"] == "Q4_K" and "Q6_K" in {t[f"blk.{i}.ffn_down.weight"] for i in range(9)}
    meta, d = types(tiny4b.drafter)
    assert d["fc.weight"] == "F16" and d["blk.0.ffn_gate.weight"] == "Q8_0"
    assert list(meta.get("dflash.target_layers")) == [2, 3, 5, 6, 7]
    assert meta.get("tokenizer.ggml.mask_token_id") == 151_669


def test_a_second_call_reuses_the_files(tiny4b):
    stamp = tiny4b.targets["Q4_K_M"].stat().st_mtime_ns
    again = write_scale_pair(tiny4b.out_dir, "tiny-qwen3-4b", quants=("Q4_K_M",), seed=0)
    assert again == tiny4b and tiny4b.targets["Q4_K_M"].stat().st_mtime_ns == stamp
    scale_main([str(tiny4b.out_dir), "--shape", "tiny-qwen3-4b", "--f16-only"])  # the device's first step, again
    assert not list(tiny4b.out_dir.glob(".f16-*"))  # nothing staged for a pair already written


def test_the_tiny_4b_pair_speculates_with_synthetic_acceptance(tiny4b):
    """A few speculative steps at synthetic L = 5: prompt tokenized by the padded vocabulary, the drafter borrowing
    the tied Q6_K embedding as its head, 16-token blocks verified. Every output id decodes (random weights pick
    padding pieces too)."""
    with api.load(tiny4b.targets["Q4_K_M"], tiny4b.drafter, config=EngineConfig(n_ctx_slot=128, synth_len=5.0)) as llm:
        assert llm.engine.block_size == 16
        prompt = llm.tokenize("Write a function that merges two sorted lists.")
        res = llm.generate(prompt, max_tokens=24, ignore_eos=True)
        text = llm.detokenize(res.tokens)
    assert len(prompt) > 5 and max(prompt) < 1000  # the tiny vocabulary's pieces, not the padding
    assert res.synthetic and len(res.tokens) == 24 and all(0 <= t < 151_936 for t in res.tokens) and text
    assert res.stats.n_drafted >= 15 and res.stats.mean_accept_len > 2.0  # several tokens per target forward


# --- the benchmark's additions (scripts/bench/http_vs_native.py) ----------------------------------------------------
@pytest.fixture(scope="module")
def bench():
    return load_bench("http_vs_native", "bench_http_scale", register=True)  # its dataclasses look their module up


def test_synthetic_lengths_replace_the_default_ones(bench):
    assert [c.id for c in bench.conditions()] == [c.id for c in bench.CONDITIONS]
    ids = [c.id for c in bench.conditions([1, 3, 5, 8])]
    assert [i for i in ids if "synth" in i and not i.endswith(("-thread", "-spare", "-adaptive"))] == [
        "native-synth1", "native-synth3", "native-synth5", "native-synth8",
        "py-synth1", "py-synth3", "py-synth5", "py-synth8"]
    assert [i for i in ids if i.endswith("-spare")] == [f"py-synth{n}-spare" for n in (1, 3, 5, 8)]
    assert "py-synth8-thread" in ids and "native-synth4" not in ids
    py5 = next(c for c in bench.conditions([5]) if c.id == "py-synth5")
    assert py5.args == ("--spec-synth-len", "5") and py5.drafter == "shipped"


def test_prompts_fold_into_the_target_vocabulary(bench):
    assert bench.fold_prompts([[2, 151_935, 151_936, 236_995]], 151_936) == [[2, 151_935, 0, 85_059]]


def test_the_scale4b_targets(bench):
    def level(x):
        return {"tok_per_s": {"median": x, "min": x, "max": x}}

    report = {"params": {"clients": [1, 8], "target_set": "scale4b"}, "conditions": {
        "native-bs": {"levels": {"1": level(100.0), "8": level(600.0)}},
        "py-plain": {"levels": {"1": level(110.0), "8": level(700.0)}},
        "py-synth5": {"levels": {"1": level(210.0), "8": level(880.0)}},
        "py-synth1-adaptive": {"levels": {"1": level(107.0), "8": level(690.0)}}}}
    v = {t["target"]: (t["ratios"], t["verdict"]) for t in bench.targets(report)}
    assert v["synthetic length 5, c1"] == ({"1": 2.1}, "met")
    assert v["synthetic length 5, c8"] == ({"8": 1.467}, "not met")
    assert v["useless drafter (L = 1), adaptive, every concurrency"] == ({"1": 0.973, "8": 0.986}, "met")
    del report["params"]["target_set"]  # a report without the key: the targets, as before
    assert "synthetic length 8, c1" in {t["target"] for t in bench.targets(report)}

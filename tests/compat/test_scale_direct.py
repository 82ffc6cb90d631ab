"""Quantized GGUFs written without an F16 file (pydflash.factory.direct): the bytes llama_model_quantize writes,
tensor by tensor, and the Gemma-4-31B shape that needs them (its F16 target alone would fill a device's disk),
written, loaded and run at toy widths."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pydflash import api
from pydflash.compat.gguf_meta import read_metadata
from pydflash.config import EngineConfig
from pydflash.factory import direct
from pydflash.factory import drafter as D
from pydflash.factory import weights as W
from pydflash.factory.scale import write_scale_pair
from pydflash.factory.shapes import GEMMA4_31B, SHAPES, TINY_GEMMA4_31B
from pydflash.factory.stream import write_streamed
from pydflash.factory.tokenizer import build_padded_vocab
from pydflash.native.quantize import quantize, quantize_rows, row_bytes


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("shape, ftype", [("tiny-qwen3-4b", "Q4_K_M"), ("tiny-qwen3-4b", "Q8_0"),
                                          ("tiny-gemma4-31b", "Q4_K_M")])
def test_direct_writes_what_llama_quantize_writes(tmp_path, shape, ftype):
    """From one F16 file's values, llama_model_quantize (llama.cpp's mix, pure=False) and write_quantized give every
    tensor the same type and the same bytes: the mix rules and ggml's row quantizer are llama.cpp's own. (A vocabulary
    of 2,048: the mix does not depend on its size, and the full one takes a minute to quantize twice here.)"""
    s = replace(SHAPES[shape], n_vocab=2048, mask_id=4 if SHAPES[shape].mask_id == 4 else 2000)
    vocab = build_padded_vocab(s.n_vocab, s.mask_id)
    plan = s.target_plan()
    f16 = write_streamed(tmp_path / "f16.gguf", s.target.arch, lambda w: s.add_target_keys(w, vocab, "f16"), plan,
                         W.rng_for(7, 0), "f16")
    quantize(f16, tmp_path / "ref.gguf", ftype, pure=False)
    staged = _tensors(f16)
    direct.write_quantized(tmp_path / "direct.gguf", s.target.arch, lambda w: s.add_target_keys(w, vocab, "f16"),
                           plan, ftype, lambda i, p: np.asarray(staged[p.name].data, dtype=np.float32), n_threads=2)
    ref, got = _tensors(tmp_path / "ref.gguf"), _tensors(tmp_path / "direct.gguf")
    assert set(ref) == set(got) == {p.name for p in plan}
    for name, t in ref.items():
        assert (Q(got[name].tensor_type).name, tuple(got[name].shape)) == (Q(t.tensor_type).name, tuple(t.shape)), name
        assert np.array_equal(np.asarray(got[name].data), np.asarray(t.data)), name
    meta = read_metadata(tmp_path / "direct.gguf")
    assert meta.get("general.file_type") == int(direct.FILE_TYPES[ftype])


def test_the_mix_at_gemma4_31b():
    """Gemma-4-31B at Q4_K_M: the tied head Q6_K; attn_v (sliding layers only: full layers use K as V) and
    ffn_down at Q6_K where use_more_bits says, counted as llama.cpp counts them; ~18.7 GB in all, what published
    Q4_K_M files of the model weigh (~19 GB)."""
    plan = GEMMA4_31B.target_plan()
    types = direct.mix_types(plan, "Q4_K_M")
    assert types["token_embd.weight"] == "Q6_K" and types["blk.0.attn_norm.weight"] == "F32"
    wv = [p.name for p in plan if p.name.endswith("attn_v.weight")]
    assert len(wv) == 50 and "blk.5.attn_v.weight" not in types
    assert sum(types[n] == "Q6_K" for n in wv) == sum(direct.use_more_bits(i, 50) for i in range(50)) == 25
    assert [i for i in range(60) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"][:9] == [0, 1, 2, 3, 4, 5, 6, 9, 12]
    size = sum(int(np.prod(p.shape)) * 4 if types[p.name] == "F32"
               else int(np.prod(p.shape[:-1])) * row_bytes(types[p.name], p.shape[-1]) for p in plan)
    assert 18.0e9 < size < 19.5e9, size


def test_draws_do_not_depend_on_the_thread_count():
    p = W.Planned("m", (2 * direct.ROWS_PER_STREAM + 5, 256), "matrix", 1.5)
    a, b = direct.draw(p, 3, 9, 1), direct.draw(p, 3, 9, 4)
    assert np.array_equal(a, b) and abs(float(a.std()) * 16 - 1.5) < 0.01
    assert not np.array_equal(a, direct.draw(p, 3, 10, 1))  # another tensor, another stream


def test_row_quantizer_refuses_rows_of_part_of_a_block():
    with pytest.raises(ValueError, match="whole 256-value blocks"):
        quantize_rows(np.zeros((2, 200), np.float32), "Q4_K")  # ggml would abort the process
    with pytest.raises(ValueError, match="unknown row type"):
        quantize_rows(np.zeros((2, 256), np.float32), "Q3_K")


@pytest.mark.slow
def test_a_tiny_gemma4_31b_pair_runs(tmp_path):
    """The Gemma-4-31B shape at toy widths, written directly (its default), loaded with the Gemma rules inherited
    (embedding scale sqrt(256), softcap 30), six taps, mask 4, drafting 16-token blocks at synthetic L = 5."""
    pair = write_scale_pair(tmp_path, TINY_GEMMA4_31B)
    assert not list(tmp_path.glob(".f16-*")) and not (tmp_path / "target-f16.gguf").exists()
    meta = read_metadata(pair.drafter)
    assert list(meta.get("dflash.target_layers")) == [2, 4, 5, 7, 8, 10]
    assert meta.get("tokenizer.ggml.mask_token_id") == 4 and len(D.drafter_plan(TINY_GEMMA4_31B.drafter())) == 58
    with api.load(pair.targets["Q4_K_M"], pair.drafter, config=EngineConfig(n_ctx_slot=128, synth_len=5.0)) as llm:
        t = llm.engine.pair.transforms
        assert (t.embedding_scale, t.logit_softcap) == (16.0, 30.0)
        res = llm.generate(llm.tokenize("Summarise the following notes in three bullet points."), max_tokens=24,
                           ignore_eos=True)
    assert res.synthetic and len(res.tokens) == 24 and all(0 <= x < 262_144 for x in res.tokens)
    assert res.stats.n_drafted >= 15 and res.stats.mean_accept_len > 2.0

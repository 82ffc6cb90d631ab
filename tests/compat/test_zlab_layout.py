"""z-lab's drafter layout end to end: a tiny DFlashDraftModel built and saved by z-lab's own code (``dflash`` 0.1.0,
standing for Qwen3-4B-DFlash-b16 at toy widths) goes through ``pydflash-convert-drafter`` for the tiny qwen3
target, matches its checkpoint (pydflash-compare-weights) and the PyTorch reference (drafter logits), and runs in
the engine; quantized and with a reduced head too. Each broken checkpoint or wrong pairing is one line and exit 2
from the CLI, and a typed exception from the Python API.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("torch", reason="building a z-lab drafter needs torch (pip install -e .[parity])")
pytest.importorskip("dflash.model", reason="needs z-lab dflash 0.1.0 (pip install --no-deps dflash==0.1.0)")

from safetensors.numpy import load_file, save_file  # noqa: E402

from tests.helpers.compat_helpers import block_logits, rewrite_gguf  # noqa: E402
from gguf import GGUFValueType as T  # noqa: E402
from tests.helpers.oracle import Oracle  # noqa: E402
from pydflash import api  # noqa: E402
from pydflash.cli import compare_weights, convert_drafter  # noqa: E402
from pydflash.compat import zlab  # noqa: E402
from pydflash.compat.gguf_meta import read_metadata  # noqa: E402
from pydflash.config import EngineConfig  # noqa: E402
from pydflash.engine.request import Request  # noqa: E402
from pydflash.errors import IncompatibleDrafter, ModelLoadError  # noqa: E402
from pydflash.pair import load_pair  # noqa: E402
from pydflash.tools.convert_drafter import convert_drafter as convert_api  # noqa: E402
from tests.helpers.zlab_helpers import REL_TOL, reference_logits, rel_diff, save_zlab_drafter  # noqa: E402

PROMPTS = ["hello world, the quick brown fox", "def add(a, b):\n    return a + b\n", "Once upon a time there was",
           "1, 2, 3, 4, 5, 6,"]


@pytest.fixture(scope="module")
def ckpt(tiny, tmp_path_factory):
    """(tiny qwen3 TinyPair, the saved z-lab checkpoint folder): two drafter layers, HF ids (0, 2, 3)."""
    p = tiny("qwen3")
    return p, save_zlab_drafter(tmp_path_factory.mktemp("zlab") / "Qwen3-tiny-DFlash-b16", p, seed=1, n_layer=2)


@pytest.fixture(scope="module")
def converted(ckpt, tmp_path_factory):
    p, folder = ckpt
    out = tmp_path_factory.mktemp("gguf") / "drafter.gguf"
    assert convert_drafter.main([str(folder), "--target", str(p.target), "-o", str(out)]) == 0
    return out


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = convert_drafter.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- the converted file


def test_metadata_follows_the_upstream_layout(ckpt, converted):
    p, _ = ckpt
    meta = read_metadata(converted)
    assert meta.arch == "dflash"
    assert meta.get("dflash.target_layers") == [1, 3, 4]  # HF ids (0, 2, 3) + 1: layer inputs
    assert meta.get("dflash.block_size") == 16 and meta.get("tokenizer.ggml.mask_token_id") == p.mask_token_id
    assert meta.get("dflash.block_count") == 2 and meta.get("dflash.embedding_length") == 64
    assert meta.get("tokenizer.ggml.tokens") == read_metadata(p.target).get("tokenizer.ggml.tokens")
    assert "dflash.embedding_scale" not in meta.kv  # a qwen3 drafter states no scale
    assert meta.tensors["fc.weight"].dims == (192, 64) and "enc.output_norm.weight" in meta.tensors
    assert not {"token_embd.weight", "output.weight"} & set(meta.tensors)  # borrowed from the target


def test_compare_weights_finds_every_tensor_equal(ckpt, converted, capsys):
    _, folder = ckpt
    assert compare_weights.main([str(folder), str(converted)]) == 0
    assert "result: OK ok=25" in capsys.readouterr().out


def test_drafter_logits_match_zlab_reference(ckpt, converted):
    p, folder = ckpt
    pair = load_pair(p.target, converted)
    try:
        feats, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    ref_feats, ref = reference_logits(folder, p.target, hidden)
    assert np.array_equal(ref_feats, feats), "dflash.target_layers is not HF target_layer_ids + 1"
    rel = rel_diff(logits, ref)
    assert rel.max() < REL_TOL, f"positions over tolerance: {np.flatnonzero(rel >= REL_TOL).tolist()}"
    assert (logits.argmax(axis=1) == ref.argmax(axis=1)).all()


def test_engine_runs_the_converted_drafter_losslessly(ckpt, converted):
    p, _ = ckpt
    oracle = Oracle(p.target, n_ctx=512)
    with api.load(p.target, converted, config=EngineConfig(n_slots=4, n_ctx_slot=512)) as llm:
        reqs = [Request(llm.tokenize(pr), max_tokens=n, ignore_eos=True) for pr, n in zip(PROMPTS, (24, 9, 17, 30))]
        results = llm.generate_many(reqs)
    for req, res in zip(reqs, results):
        assert len(res.tokens) == req.max_tokens and res.stats.n_drafted > 0
        oracle.check(req.prompt, res.tokens)
    oracle.close()


def test_quantized_with_a_reduced_head(ckpt, tmp_path, capsys):
    """Q8_0 everywhere but fc (kept F32 as converted) and the norms; then a 300-row head with an I32 d2t."""
    p, folder = ckpt
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(i) for i in range(2, 302)))
    out = tmp_path / "q.gguf"
    rc, stdout, _ = run_cli(capsys, folder, "--target", p.target, "-o", out, "--quantize", "Q8_0", "--head-ids", ids)
    assert rc == 0 and "25 tensors" in stdout
    meta = read_metadata(out)
    types = {name: t.ggml_type for name, t in meta.tensors.items()}
    assert types["fc.weight"] == 0 and types["enc.output_norm.weight"] == 0  # F32, as converted
    assert types["blk.0.attn_q.weight"] == types["blk.1.ffn_down.weight"] == 8  # Q8_0
    assert types["d2t"] == 26 and meta.tensors["d2t"].dims == (300,)  # I32: pydflash's build
    assert meta.tensors["output.weight"].dims == (64, 300)
    capsys.readouterr()
    assert compare_weights.main([str(folder), str(out)]) == 0  # d2t is the converter's, not a stray tensor
    assert "generated" in capsys.readouterr().out
    oracle = Oracle(p.target, n_ctx=512)
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=512)) as llm:
        toks = llm.tokenize(PROMPTS[0])
        res = llm.generate(toks, max_tokens=24, ignore_eos=True)
    assert res.stats.n_drafted > 0
    oracle.check(toks, res.tokens)
    oracle.close()


def test_f16_with_an_upstream_head(ckpt, tmp_path, capsys):
    """--outtype f16 from an F32 checkpoint, and the I64 d2t upstream llama.cpp reads (ours scatters with it)."""
    p, folder = ckpt
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(str(i) for i in range(2, 302)))
    out = tmp_path / "h.gguf"
    assert run_cli(capsys, folder, "--target", p.target, "-o", out, "--outtype", "f16", "--head-ids", ids,
                   "--d2t-type", "I64")[0] == 0
    types = {name: t.ggml_type for name, t in read_metadata(out).tensors.items()}
    assert types["fc.weight"] == types["blk.0.ffn_up.weight"] == 1 and types["d2t"] == 27  # F16, I64
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=256)) as llm:
        res = llm.generate(PROMPTS[3], max_tokens=8, ignore_eos=True)
    assert len(res.tokens) == 8 and res.stats.n_drafted > 0


def test_a_stated_unit_scale_loads_on_a_plain_target(ckpt, converted, tmp_path):
    """Converters that copy input_embedding_scale write 1.0 for a Qwen3 drafter: that scales nothing, and loads."""
    p, _ = ckpt
    stated = rewrite_gguf(converted, tmp_path / "one.gguf", kv={"dflash.embedding_scale": (1.0, T.FLOAT32)})
    pair = load_pair(p.target, stated)
    try:
        assert pair.transforms.embedding_scale is None
    finally:
        pair.close()


def test_bf16_checkpoint_keeps_bf16(ckpt, tmp_path, capsys):
    """z-lab publishes bf16: --outtype auto writes BF16 matrices (the checkpoint's own bits), F32 norms."""
    import torch
    from dflash.model import DFlashDraftModel

    p, folder = ckpt
    bf = tmp_path / "bf16"
    DFlashDraftModel.from_pretrained(str(folder)).to(torch.bfloat16).save_pretrained(str(bf))
    out = tmp_path / "bf16.gguf"
    assert run_cli(capsys, bf, "--target", p.target, "-o", out)[0] == 0
    types = {name: t.ggml_type for name, t in read_metadata(out).tensors.items()}
    assert types["blk.0.attn_q.weight"] == 30 and types["blk.0.attn_norm.weight"] == 0  # BF16, F32
    assert compare_weights.main([str(bf), str(out)]) == 0
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=256)) as llm:
        assert len(llm.generate(PROMPTS[2], max_tokens=8, ignore_eos=True).tokens) == 8


def test_gemma4_checkpoint_states_its_transforms(tiny, tmp_path):
    """A z-lab drafter for the tiny gemma4 target, its config stating input_embedding_scale 8 and
    final_logit_softcapping 30 as z-lab's Gemma drafters do: both written, both agreeing with the target (no
    override needed), the reference matched once our logits take the cap, and the engine runs it."""
    p = tiny("gemma4")
    folder = save_zlab_drafter(tmp_path / "gemma4-tiny-DFlash", p, seed=2, input_embedding_scale=8.0,
                               final_logit_softcapping=30.0)
    out = convert_api(folder, p.target, tmp_path / "g4.gguf").out
    meta = read_metadata(out)
    assert meta.get("dflash.embedding_scale") == 8.0 and meta.get("dflash.final_logit_softcapping") == 30.0
    pair = load_pair(p.target, out)
    try:
        assert (pair.transforms.embedding_scale, pair.transforms.logit_softcap) == (8.0, 30.0)
        _, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    _, ref = reference_logits(folder, p.target, hidden)
    assert rel_diff(30.0 * np.tanh(logits / 30.0), ref).max() < REL_TOL
    oracle = Oracle(p.target, n_ctx=512)
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=512)) as llm:
        toks = llm.tokenize(PROMPTS[1])
        res = llm.generate(toks, max_tokens=20, ignore_eos=True)
    oracle.check(toks, res.tokens)
    oracle.close()


@pytest.mark.parametrize("is_causal", [False, None])
def test_sliding_layers(ckpt, tmp_path, capsys, is_causal):
    """layer_types [sliding, full] with a 16-token window (z-lab's Gemma-4-31B drafter: four sliding layers of 2048,
    then one full). The window and pattern are written either way. With is_causal false the reference is matched;
    left unset, z-lab's reference runs the sliding layers causally inside the block, which llama.cpp's dflash graph
    cannot (one causal flag per context): the conversion warns, and this test measures the gap it warns about.
    The engine's output is the target's in both cases."""
    p, folder = ckpt
    cfg = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16, "use_sliding_window": True}
    src = variant(folder, tmp_path / "swa", config={**cfg, "is_causal": is_causal})
    out = tmp_path / "swa.gguf"
    rc, _, err = run_cli(capsys, src, "--target", p.target, "-o", out)
    assert rc == 0 and ("runs them non-causally" in err) == (is_causal is None), err
    meta = read_metadata(out)
    assert meta.get("dflash.attention.sliding_window") == 16
    assert meta.get("dflash.attention.sliding_window_pattern") == [True, False]
    pair = load_pair(p.target, out)
    try:
        _, logits, hidden = block_logits(pair, all_layers=True)
    finally:
        pair.close()
    rel = rel_diff(logits, reference_logits(src, p.target, hidden)[1])
    assert rel.max() < REL_TOL if is_causal is False else rel.max() > 50 * REL_TOL, rel.max()
    oracle = Oracle(p.target, n_ctx=512)
    with api.load(p.target, out, config=EngineConfig(n_ctx_slot=512)) as llm:
        toks = llm.tokenize(" ".join(PROMPTS) * 2)  # past the window
        res = llm.generate(toks, max_tokens=24, ignore_eos=True)
    oracle.check(toks, res.tokens)
    oracle.close()


def test_gemma4_31b_shaped_config(tiny, tmp_path, capsys):
    """The layout of z-lab's gemma-4-31B-it-DFlash config at toy size: final_logit_softcapping at the top level, no
    input_embedding_scale (pydflash inherits sqrt(n_embd)), sliding layers then a full one (a caveat, printed)."""
    p = tiny("gemma4")
    folder = save_zlab_drafter(tmp_path / "gemma4-tiny-DFlash", p, seed=3, n_layer=2)
    src = variant(folder, tmp_path / "shaped", config={
        "final_logit_softcapping": 30.0, "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 2048, "use_sliding_window": True, "tie_word_embeddings": True})
    out = tmp_path / "g4.gguf"
    rc, stdout, err = run_cli(capsys, src, "--target", p.target, "-o", out)
    assert rc == 0 and "warning: layers [0] are sliding_attention" in err and "target layer inputs" in stdout
    meta = read_metadata(out)
    assert "dflash.embedding_scale" not in meta.kv and meta.get("dflash.final_logit_softcapping") == 30.0
    pair = load_pair(p.target, out)
    try:
        assert (pair.transforms.embedding_scale, pair.transforms.logit_softcap) == (8.0, 30.0)
    finally:
        pair.close()
    oracle = Oracle(p.target, n_ctx=512)
    with api.load(p.target, out, config=EngineConfig(n_slots=2, n_ctx_slot=512)) as llm:
        reqs = [Request(llm.tokenize(pr), max_tokens=16, ignore_eos=True) for pr in PROMPTS[:2]]
        results = llm.generate_many(reqs)
    for req, res in zip(reqs, results):
        oracle.check(req.prompt, res.tokens)
    oracle.close()


# ---------------------------------------------------------------- refusals


def variant(src, dst, config=None, drop=()):
    """A copy of checkpoint src with config.json entries replaced (None deletes) and tensors dropped."""
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    for key, value in (config or {}).items():
        node, leaf = (cfg["dflash_config"], key[4:]) if key.startswith("dfc.") else (cfg, key)
        node.pop(leaf, None) if value is None else node.__setitem__(leaf, value)
    (dst / "config.json").write_text(json.dumps(cfg))
    if drop:
        tensors = load_file(str(src / "model.safetensors"))
        save_file({k: v for k, v in tensors.items() if k not in drop}, str(dst / "model.safetensors"))
    else:
        os.link(src / "model.safetensors", dst / "model.safetensors")
    return dst


CASES = {
    "missing tensor": ({"drop": ("layers.1.mlp.up_proj.weight",)}, zlab.CheckpointError,
                       r"lacks 1 tensor\(s\) a DFlash drafter needs: layers.1.mlp.up_proj.weight"),
    "block size 1": ({"config": {"dfc.block_size": 1}}, zlab.PairingError, r"block_size 1 outside \[2, 64\]"),
    "block size 100": ({"config": {"dfc.block_size": 100, "block_size": 100}}, zlab.PairingError,
                       r"block_size 100 outside \[2, 64\]"),
    "mask past vocab": ({"config": {"dfc.mask_token_id": 5000}}, zlab.PairingError,
                        "mask_token_id 5000 lies outside the target's vocabulary"),
    "no mask": ({"config": {"dfc.mask_token_id": None}}, zlab.CheckpointError, "no mask_token_id"),
    "layer past the target": ({"config": {"dfc.target_layer_ids": [0, 2, 4]}}, zlab.PairingError,
                              r"reach beyond the target's depth: ids must lie in 0\.\.3 .*offending: \[4\]"),
    "deeper target": ({"config": {"num_target_layers": 36}}, zlab.PairingError,
                      "trained on a 36-layer target; this qwen3 target has 5 layers"),
    "fewer ids than fc": ({"config": {"dfc.target_layer_ids": [0, 2]}}, zlab.CheckpointError,
                          r"fc.weight is \[64, 192\], config.json says \[64, 128\]"),
    "dflash2": ({"config": {"architectures": ["DFlash2DraftModel"]}}, zlab.CheckpointError, "DFlash2"),
    "causal": ({"config": {"is_causal": True}}, zlab.CheckpointError, "causal drafter"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refusals_are_one_line_and_exit_2(ckpt, tmp_path, capsys, case):
    p, folder = ckpt
    kw, _, message = CASES[case]
    src = variant(folder, tmp_path / "ckpt", **kw)
    out = tmp_path / "out.gguf"
    rc, stdout, stderr = run_cli(capsys, src, "--target", p.target, "-o", out)
    assert rc == 2 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("pydflash-convert-drafter: error: "), stderr
    assert re.search(message, stderr), stderr
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


@pytest.mark.parametrize("case", list(CASES))
def test_refusals_are_typed_in_the_python_api(ckpt, tmp_path, case):
    p, folder = ckpt
    kw, error, message = CASES[case]
    src = variant(folder, tmp_path / "ckpt", **kw)
    with pytest.raises(error, match=message) as info:
        convert_api(src, p.target, tmp_path / "out.gguf")
    family = IncompatibleDrafter if error is zlab.PairingError else ModelLoadError
    assert isinstance(info.value, (zlab.ConversionError, family))


def test_missing_inputs_exit_2(ckpt, tmp_path, capsys):
    p, folder = ckpt
    assert run_cli(capsys, tmp_path / "nowhere", "--target", p.target, "-o", tmp_path / "o.gguf")[0] == 2
    rc, _, err = run_cli(capsys, folder, "--target", tmp_path / "none.gguf", "-o", tmp_path / "o.gguf")
    assert rc == 2 and "none.gguf" in err
    assert run_cli(capsys, folder, "--target", p.target)[0] == 2  # no -o and no --dry-run
    rc, out, _ = run_cli(capsys, folder, "--target", p.target, "--dry-run")
    assert rc == 0 and out.startswith("(dry run)") and "target layer inputs [1, 3, 4]" in out


def test_wrong_target_is_refused(ckpt, tiny, tmp_path):
    """The same drafter for the gemma3 target (six layers, not the five it was trained on)."""
    _, folder = ckpt
    with pytest.raises(zlab.PairingError, match="trained on a 5-layer target; this gemma3 target has 6 layers"):
        convert_api(folder, tiny("gemma3").target, tmp_path / "out.gguf")

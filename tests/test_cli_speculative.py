"""pydflash-speculative end to end, as a subprocess: JSON report, text + stats, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "pydflash.cli.speculative"]


def run(*args, timeout=300):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout)


def test_json_report(tiny):
    p = tiny("qwen3")
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "hello world", "-n", "24", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "n_prompt", "n_generated", "n_drafted", "n_accepted", "accept_rate", "mean_accept_len",
                "tokens_per_second"):
        assert key in out
    assert out["n_generated"] > 0 and out["n_drafted"] > 0
    assert out["n_prompt"] > 0 and out["tokens_per_second"] > 0


def test_text_and_stats_block(tiny):
    p = tiny("gemma3")
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "hello", "-n", "16", "--draft-max", "4")
    assert r.returncode == 0, r.stderr
    for word in ("n_drafted", "n_accept", "accept:", "tau:", "tok/s", "verify"):
        assert word in r.stderr


def test_no_spec_matches_spec_text(tiny):
    p = tiny("llama")
    a = json.loads(run("-m", str(p.target), "-md", str(p.drafter), "-p", "the cat", "-n", "20", "--json").stdout)
    b = json.loads(run("-m", str(p.target), "-md", str(p.drafter), "-p", "the cat", "-n", "20", "--json",
                       "--no-spec").stdout)
    assert b["n_drafted"] == 0
    assert a["text"] == b["text"]


def test_synthetic_is_labelled(tiny):
    p = tiny("qwen3")
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "-n", "16", "--spec-synth-len", "4")
    assert r.returncode == 0, r.stderr
    assert "NOT valid" in r.stderr


def _bad(r):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pydflash-speculative: error:"), r.stderr
    assert "Traceback" not in r.stderr


def test_missing_file(tmp_path, tiny):
    _bad(run("-m", str(tmp_path / "nope.gguf"), "-p", "x"))
    _bad(run("-m", str(tiny("qwen3").target), "-md", str(tmp_path / "nope.gguf"), "-p", "x"))


def test_not_a_gguf(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    _bad(run("-m", str(f), "-p", "x"))


def test_truncated_gguf(tmp_path, tiny):
    data = tiny("qwen3").target.read_bytes()
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[: len(data) // 3])
    _bad(run("-m", str(f), "-p", "x"))


def test_drafter_is_not_a_drafter(tiny):
    p = tiny("qwen3")
    _bad(run("-m", str(p.target), "-md", str(p.target), "-p", "x"))


@pytest.mark.real_model
def test_drafter_for_another_target(tiny, gemma_path):
    _bad(run("-m", str(gemma_path), "-md", str(tiny("gemma3").drafter), "-p", "x"))


def test_bad_flags(tiny):
    p = tiny("qwen3")
    _bad(run("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "--temp", "-1"))
    _bad(run("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "--top-p", "0"))
    _bad(run("-m", str(p.target), "-p", "x", "-c", "16", "-n", "64"))  # does not fit the context
    _bad(run("-m", str(p.target), "-p", "", "-n", "4"))

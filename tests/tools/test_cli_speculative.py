"""pydflash-speculative end to end, as a subprocess: JSON report, text + stats, and one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import signal
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


# --- pipes, argparse, Ctrl-C, empty prompts, messages that name the file and our own flags ---


def test_closed_pipe_exits_quietly(tiny):
    """`| head -c 1` closes stdout while text still streams: exit 0, and no error, traceback or flush warning."""
    p = tiny("qwen3")
    cmd = " ".join(CLI + ["-m", str(p.target), "-md", str(p.drafter), "-p", "hello", "-n", "3000"])
    r = subprocess.run(["bash", "-c", f"{cmd} | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Broken pipe" not in r.stderr and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr
    assert "error" not in r.stderr, r.stderr


def test_closed_pipe_during_json(tiny):
    """The JSON object is written at the end; a reader already gone must still mean exit 0, and no error at the
    interpreter's flush at exit (which would make the status 120)."""
    p = tiny("qwen3")
    proc = subprocess.Popen(CLI + ["-m", str(p.target), "-md", str(p.drafter), "-p", "hello", "-n", "8", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first byte
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == "", err


def test_argparse_errors_are_one_line(tiny):
    _bad(run("--no-such-flag"))
    _bad(run("-n", "many"))
    _bad(run("-p", "a", "-f", "b"))  # mutually exclusive


def _sigint_as_in_a_terminal() -> None:
    """A shell without job control starts background commands with SIGINT ignored, their children inherit that,
    and Python then installs no KeyboardInterrupt handler: a suite run with `make test &` saw the CLI ignore the
    signal and finish its 3,000 tokens. A Ctrl-C comes from a terminal, where SIGINT has its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_a_newline_and_exits_130(tiny):
    p = tiny("qwen3")
    proc = subprocess.Popen(CLI + ["-m", str(p.target), "-md", str(p.drafter), "-p", "hello", "-n", "3000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_sigint_as_in_a_terminal)
    first = os.read(proc.stdout.fileno(), 1)  # text is streaming: the interrupt lands mid-generation
    assert first, proc.stderr.read().decode()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err.decode()
    assert (first + out).endswith(b"\n")
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
    assert b"n_generated" not in err  # interrupted, so no stats block claiming a finished run


def test_empty_prompt_is_refused_before_any_model_loads(tmp_path):
    missing = str(tmp_path / "never-opened.gguf")  # a load would fail on this path first
    r = run("-m", missing, "-p", "")
    _bad(r)
    assert "empty" in r.stderr and missing not in r.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = run("-m", missing, "-f", str(empty))
    _bad(r)
    assert f"prompt file {empty} is empty" in r.stderr


def test_errors_name_the_file(tmp_path, tiny):
    p = tiny("qwen3")
    prompt = tmp_path / "no-prompt.txt"
    r = run("-m", str(p.target), "-f", str(prompt))
    _bad(r)
    assert str(prompt) in r.stderr
    missing = tmp_path / "nope.gguf"
    r = run("-m", str(missing), "-p", "x")
    _bad(r)
    assert str(missing) in r.stderr
    r = run("-m", str(p.target), "-md", str(p.target), "-p", "x")  # a target is no drafter
    _bad(r)
    assert str(p.target) in r.stderr


def test_context_overflow_suggests_the_cli_flags(tiny):
    p = tiny("qwen3")
    r = run("-m", str(p.target), "-p", "hello world", "-n", "100", "-c", "64")
    _bad(r)
    assert "exceeds the slot context (64)" in r.stderr and "-c/--ctx-size" in r.stderr and "-n/--n-predict" in r.stderr


def test_scale_mismatch_suggests_the_cli_flag(tiny):
    p = tiny("gemma3", embedding_scale_key=64.0)
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "-n", "4")
    _bad(r)
    assert str(p.drafter) in r.stderr and "embedding scale is 64" in r.stderr
    assert "--allow-scale-mismatch" in r.stderr and "allow_scale_mismatch=True" not in r.stderr
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "x", "-n", "4", "--allow-scale-mismatch", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_generated"] == 4


def test_scale_mismatch_api_phrasing(tiny):
    """The same fact, phrased for the Python API by the exception itself."""
    from pydflash.compat.inherit import TransformMismatch
    from pydflash.pair import load_pair

    p = tiny("gemma3", embedding_scale_key=64.0)
    with pytest.raises(TransformMismatch, match=r"allow_scale_mismatch=True") as info:
        load_pair(p.target, p.drafter)
    assert str(p.drafter) in info.value.fact and "allow_scale_mismatch" not in info.value.fact


# --- adaptive drafting is the default; a fixed block is opt-in ---


def _json(*args):
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_adaptive_drafting_is_the_default(tiny):
    p = tiny("qwen3")  # a random drafter: nothing is accepted, so adaptive drafting stops drafting
    base = ["-m", str(p.target), "-md", str(p.drafter), "-p", "hello world", "-n", "48"]
    default = _json(*base)
    assert default["draft_adaptive"] is True
    assert 0 < default["n_draft_steps"] < default["n_steps"]
    assert _json(*base, "--draft-adaptive")["draft_adaptive"] is True  # the old flag still works
    fixed = _json(*base, "--draft-max", "4", "--no-draft-adaptive")
    assert fixed["draft_adaptive"] is False
    # a fixed block of 4 in every step but where max_tokens leaves room for fewer (the last four steps, one token a
    # step where nothing is accepted: 3, 2, 1, then none)
    assert fixed["n_draft_steps"] >= fixed["n_steps"] - 1 and fixed["n_drafted"] <= 4 * fixed["n_steps"]
    if fixed["n_accepted"] == 0:
        assert fixed["n_steps"] == 48 and fixed["n_drafted"] == 4 * 44 + 3 + 2 + 1
    assert fixed["text"] == default["text"]  # greedy either way
    unlooked = _json(*base, "--draft-max", "4", "--no-draft-adaptive", "--no-lookup")
    assert unlooked["n_lookup_steps"] == 0 and unlooked["text"] == fixed["text"]


def test_n_minus_one_runs_to_eos_or_the_context_end(tiny):
    """-n -1 as in llama.cpp: no count, generation stops at EOS or where the context ends."""
    p = tiny("gemma3")
    r = run("-m", str(p.target), "-md", str(p.drafter), "-p", "hello", "-n", "-1", "-c", "512", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["n_generated"] >= 1 and out["n_prompt"] + out["n_generated"] <= 512
    # past the default 128 unless EOS came first
    assert out["finish_reason"] == "stop" or out["n_generated"] > 128, out


@pytest.mark.parametrize("n", ["0", "-2"])
def test_bad_n_names_the_flag(tiny, n):
    r = run("-m", str(tiny("gemma3").target), "-p", "x", "-n", n)
    _bad(r)
    assert "-n" in r.stderr and "max_tokens" not in r.stderr

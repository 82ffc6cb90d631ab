"""pydflash-server's command line: bad flags and bad configs print one line and exit 2, before any model loads."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from tests.helpers.server_util import REPO


def run(*args):
    return subprocess.run([sys.executable, "-m", "pydflash.cli.server", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args,words", [
    (["--config", "/nonexistent/models.toml"], "cannot read"),
    (["-m", "/nonexistent.gguf"], "no such model file"),
    (["-md", "x.gguf"], "-md needs -m"),
    (["--port", "0"], "--port"),
    (["--max-resident", "0"], "--max-resident"),
    (["--frobnicate"], "unrecognized arguments"),
    (["-np", "many"], "invalid int value"),
    (["--slot-save-path", "/nonexistent/slots"], "--slot-save-path"),
    (["--cache-ram", "-1"], "ram_mib"),
    (["--ctx-checkpoint-every", "-1"], "checkpoint_every"),
    (["--spec-synth-len", "0.5"], "synth_len"),
    (["--no-spec", "--spec-synth-len", "3"], "synth_len needs a drafter"),
    (["--ray", "local", "--ray-replicas", "0"], "--ray-replicas"),  # refused before Ray starts
])
def test_bad_flags_one_line_exit_2(args, words):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr


def test_bad_config_contents(tmp_path):
    cfg = tmp_path / "models.toml"
    for text, words in [("[a]\ntarget = 'x.gguf'\nn_slots = 0\n", "n_slots"),
                        ("[a]\nwizard = 1\n", "unknown keys"), ("not toml [", "models.toml"),
                        ("default = 'b'\n[a]\ntarget = 'x.gguf'\n", "default preset"),
                        ("[a]\ntarget = 'x.gguf'\nwarm_up = 'no'\n", "warm_up must be true or false"),
                        ("[a]\ntarget = 'x.gguf'\nlookup = 'no'\n", "lookup must be true or false")]:
        cfg.write_text(text)
        r = run("--config", str(cfg))
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_cache_flags_reach_the_preset(tmp_path):
    from pydflash.cli.server import build_models, parse_args

    args = parse_args(["--cache-ram", "0", "--no-cache-reuse", "--ctx-checkpoint-every", "32", "--slot-save-path",
                       str(tmp_path), "--spec-synth-len", "2.5"])
    p = build_models(args).presets["default"]
    assert (p.cache_reuse, p.cache_ram_mib, p.checkpoint_every) == (False, 0, 32)
    assert p.slot_save_path == str(tmp_path) and p.synth_len == 2.5
    assert not p.draft_adaptive  # forced acceptance assumes a fixed block, as pydflash-speculative
    # unless asked for: a useless drafter (L = 1) under adaptive drafting, what the 4B-scale benchmark measures
    synth_adaptive = build_models(parse_args(["--spec-synth-len", "1", "--draft-adaptive"])).presets["default"]
    assert synth_adaptive.draft_adaptive and synth_adaptive.engine_config().adaptive
    assert build_models(parse_args([])).presets["default"].draft_adaptive
    assert not build_models(parse_args(["--no-draft-adaptive"])).presets["default"].draft_adaptive
    assert p.lookup and p.engine_config().lookup  # copied chains: on unless --no-lookup
    assert not build_models(parse_args(["--no-lookup"])).presets["default"].engine_config().lookup
    default = build_models(parse_args([])).presets["default"]
    assert (default.cache_reuse, default.cache_device_cells, default.cache_ram_mib, default.slot_save_path,
            default.synth_len) == (True, -1, 0, None, None)
    # the load-time warm-up: on by default (where the engine decides: a GPU), off with llama-server's flag
    assert default.engine_config().warm_up is None
    assert build_models(parse_args(["--no-warmup"])).presets["default"].engine_config().warm_up is False


def test_flags_and_the_ray_app_build_the_same_presets(tmp_path):
    """pydflash-server's flags and the Ray app's arguments go through the same ServerModels constructors: the
    embedded default without flags, a models.toml as it is, one -m pair under its file's stem."""
    from pydflash.cli.server import build_models, parse_args
    from pydflash.server.preset import EMBEDDED, ServerModels

    assert build_models(parse_args([])) == ServerModels.single()
    assert ServerModels.single().presets["default"].target == EMBEDDED
    cfg = tmp_path / "models.toml"
    cfg.write_text("[a]\ntarget = 'x.gguf'\n[b]\ntarget = 'y.gguf'\ndrafter = ''\n")
    assert build_models(parse_args(["--config", str(cfg)])) == ServerModels.from_toml(cfg)
    target, drafter = tmp_path / "big.gguf", tmp_path / "big-dflash.gguf"
    target.write_bytes(b"GGUF")
    drafter.write_bytes(b"GGUF")
    one = build_models(parse_args(["-m", str(target), "-md", str(drafter), "-np", "2"]))
    assert one.default == "big" and one.presets["big"] == ServerModels.single(
        str(target), str(drafter), n_slots=2).presets["big"]
    assert one.presets["big"].drafter == str(drafter)
    assert build_models(parse_args(["-m", str(target), "-md", str(drafter), "--no-spec"])).presets["big"].drafter == ""
    with pytest.raises(ValueError, match="no such drafter file"):
        ServerModels.single(str(target), str(tmp_path / "missing.gguf"))


@pytest.fixture
def started(monkeypatch, caplog):
    """main() up to the point where uvicorn would serve: the log records it made, at every level."""
    import uvicorn

    import pydflash.server.app as app_mod
    from pydflash.cli import server as cli

    monkeypatch.delenv("PYDFLASH_API_KEY", raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setattr(app_mod, "create_app", lambda *a, **kw: object())

    def start(*args):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert cli.main(list(args)) == 0
        return caplog.records

    return start


def _warnings(records):
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_public_host_without_key_warns_specifically(started):
    warned = _warnings(started("--host", "0.0.0.0"))
    assert len(warned) == 1 and "0.0.0.0" in warned[0] and "--api-key" in warned[0], warned


@pytest.mark.parametrize("args", [["--host", "0.0.0.0", "--api-key", "k"], ["--host", "127.0.0.1"], [],
                                  ["--host", "::1"], ["--host", "localhost"]])
def test_no_warning_where_it_does_not_apply(started, args):
    records = started(*args)
    assert _warnings(records) == []
    assert any("serving" in r.getMessage() and r.levelno == logging.INFO for r in records)

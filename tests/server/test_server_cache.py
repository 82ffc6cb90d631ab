"""The prompt cache through pydflash-server: cached_tokens on repeats, slot files (save / restore / erase) and
their refusals, cache metrics, and the cache options of models.toml.

One server, three presets (tiny pairs, fixed draft block so the random drafter keeps drafting and the features
stay complete):
- ``g``    gemma3 pair, 2 slots, a RAM cache of ~2 entries, no slot_save_path (slot files refused);
- ``one``  gemma3 pair, 1 slot (so the slot id is known), no RAM cache (only a restore can bring a prompt back);
- ``q``    qwen3 pair, 1 slot, the same slot directory (a file saved by ``one`` is foreign there).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.oracle import Oracle
from tests.helpers.server_util import Server, write_models_toml

N_PROMPT = 150


def prompt(seed: int) -> list[int]:
    """Token ids (no BOS, no EOS): distinct seeds share no prefix beyond chance."""
    return [int(t) for t in np.random.default_rng(seed).integers(10, 500, N_PROMPT)]


@pytest.fixture(scope="module")
def pairs(tiny):
    return tiny("gemma3"), tiny("qwen3")


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def server(pairs, slot_dir, tmp_path_factory):
    g, q = pairs
    common = {"n_ctx_slot": 4096, "draft_adaptive": False, "checkpoint_every": 64}
    cfg = write_models_toml(tmp_path_factory.mktemp("srv") / "models.toml", {
        # the RAM tier alone ("g"), and slot files with no other tier to fall back on ("one")
        "g": {"target": str(g.target), "drafter": str(g.drafter), "n_slots": 2, "cache_ram_mib": 0.3,
              "cache_device_cells": 0, **common},
        "one": {"target": str(g.target), "drafter": str(g.drafter), "n_slots": 1, "cache_ram_mib": 0,
                "cache_device_cells": 0,
                "slot_save_path": str(slot_dir), **common},
        "q": {"target": str(q.target), "drafter": str(q.drafter), "n_slots": 1, "slot_save_path": str(slot_dir),
              **common},
    }, default="g")
    srv = Server(["--config", str(cfg), "--max-resident", "3"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oracle(pairs):
    o = Oracle(pairs[0].target)
    yield o
    o.close()


def complete(server, model, tokens, **kw):
    body = {"model": model, "prompt": tokens, "max_tokens": 16, "temperature": 0, "return_tokens": True,
            "ignore_eos": True, **kw}
    r = server.http().post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["tokens"], out["usage"]["prompt_tokens_details"]["cached_tokens"]


def slot(server, model, id_slot, action, filename=None):
    body = {"model": model} if filename is None else {"model": model, "filename": filename}
    return server.http().post(f"/slots/{id_slot}", params={"action": action}, json=body)


def refused(r, status=400, words=""):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] and words in err["message"], err
    return err


def test_repeat_reuses_the_prompt(server, oracle):
    p = prompt(1)
    first, cached0 = complete(server, "g", p)
    again, cached1 = complete(server, "g", p)
    assert cached0 == 0 and cached1 >= 0.9 * len(p)
    oracle.check(p, first)  # both equal plain greedy decoding up to float near-ties
    oracle.check(p, again, base_tokens=first)
    _, cached2 = complete(server, "g", p, cache_prompt=False)
    assert cached2 == 0


def test_save_evict_restore(server, oracle, slot_dir):
    p, other = prompt(2), prompt(3)
    first, _ = complete(server, "one", p)
    r = slot(server, "one", 0, "save", "p.bin")
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 0 and saved["filename"] == "p.bin" and saved["n_saved"] >= len(p)
    assert saved["n_written"] == (slot_dir / "p.bin").stat().st_size and saved["timings"]["save_ms"] >= 0
    complete(server, "one", other)  # the only slot now keeps `other`; no RAM cache to fall back on
    _, cached = complete(server, "one", p)
    assert cached == 0  # gone
    complete(server, "one", other)
    r = slot(server, "one", 0, "restore", "p.bin")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["n_restored"] == saved["n_saved"] and got["n_read"] == saved["n_written"]
    assert got["timings"]["restore_ms"] >= 0
    tokens, cached = complete(server, "one", p)
    assert cached >= 0.9 * len(p)
    oracle.check(p, tokens, base_tokens=first)
    r = slot(server, "one", 0, "erase")
    assert r.status_code == 200 and r.json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
    assert complete(server, "one", p)[1] == 0


def test_refusals_leave_the_slot_usable(server, oracle, slot_dir):
    p = prompt(4)
    first, _ = complete(server, "one", p)
    assert slot(server, "one", 0, "save", "good.bin").status_code == 200
    data = (slot_dir / "good.bin").read_bytes()
    (slot_dir / "trunc.bin").write_bytes(data[: len(data) // 2])
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    (slot_dir / "corrupt.bin").write_bytes(bytes(bad))
    (slot_dir / "junk.bin").write_bytes(b"not a slot file at all" * 10)

    for name, words in [("trunc.bin", "slot file"), ("corrupt.bin", "checksum"), ("junk.bin", "slot file"),
                        ("missing.bin", "cannot read"), ("../good.bin", "invalid slot file name"),
                        ("a/b.bin", "invalid slot file name"), (".hidden", "invalid slot file name")]:
        refused(slot(server, "one", 0, "restore", name), 400, words)
    refused(slot(server, "one", 0, "restore"), 400, "filename")
    refused(slot(server, "one", 0, "save", "sub/x.bin"), 400, "invalid slot file name")
    refused(slot(server, "one", 1, "save", "x.bin"), 400, "no slot 1")
    refused(slot(server, "one", -1, "erase"), 400, "no slot -1")
    refused(server.http().post("/slots/zero", params={"action": "save"}, json={"model": "one"}), 400, "id_slot")
    refused(slot(server, "one", 0, "frobnicate", "x.bin"), 400, "action")
    refused(server.http().post("/slots/0", json={"model": "one"}), 400, "action")
    refused(slot(server, "g", 0, "save", "x.bin"), 400, "--slot-save-path")  # g has no slot directory
    refused(slot(server, "nope", 0, "save", "x.bin"), 404)
    # the refused restores touched nothing: the kept prompt is still there, and still right
    tokens, cached = complete(server, "one", p)
    assert cached >= 0.9 * len(p)
    oracle.check(p, tokens, base_tokens=first)


def test_busy_slot_refused(server, oracle):
    p = prompt(5)
    body = {"model": "one", "prompt": p, "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    with server.http() as h, h.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a dropped iterator closes the stream, which cancels the request
        assert next(lines).startswith("data: ")  # generating: the slot is taken until the stream ends or is cancelled
        for action in ("save", "restore", "erase"):
            refused(slot(server, "one", 0, action, "busy.bin"), 400, "busy")
    tokens, _ = complete(server, "one", p)  # the cancelled stream freed the slot
    oracle.check(p, tokens)


def test_foreign_file_refused(server, pairs):
    p = prompt(6)
    complete(server, "one", p)
    assert slot(server, "one", 0, "save", "from-one.bin").status_code == 200
    refused(slot(server, "q", 0, "restore", "from-one.bin"), 400, "another target or drafter")
    q_prompt = [t % 200 + 10 for t in p]  # the qwen3 tiny vocabulary may be smaller
    first, _ = complete(server, "q", q_prompt)
    again, cached = complete(server, "q", q_prompt)
    assert cached >= 0.9 * len(q_prompt) and len(again) == len(first)


def test_metrics_move(server):
    def read():
        names = ["reused_tokens", "fallbacks", "ram_hits", "ram_misses", "ram_evictions"]
        out = {n: server.metric(f"pydflash_prompt_cache_{n}_total", model="g") for n in names}
        out["ram_bytes"] = server.metric("pydflash_prompt_cache_ram_bytes", model="g")
        out["ram_entries"] = server.metric("pydflash_prompt_cache_ram_entries", model="g")
        return out

    for i in (0, 1):  # erase needs no slot directory
        assert slot(server, "g", i, "erase").status_code == 200
    before = read()
    # 2 slots, 2 RAM entries: 10 -> slot 0, 11 -> slot 1, 12 and 13 push 10 then 12 into RAM (now full); 10 comes
    # back from RAM, and saving 13 first evicts an entry (once 10 itself: the worker died of a KeyError)
    for seed in (10, 11, 12, 13, 10):
        _, cached = complete(server, "g", prompt(seed), max_tokens=4)
    assert cached >= 0.9 * N_PROMPT
    after = read()
    for key in ("reused_tokens", "ram_hits", "ram_misses", "ram_evictions"):
        assert after[key] > before[key], f"{key}: {before} -> {after}"
    assert after["ram_bytes"] > 0 and after["ram_entries"] >= 1
    assert after["ram_bytes"] <= 0.3 * 1024 * 1024


def test_models_toml_cache_keys(tmp_path):
    from pydflash.server.preset import ConfigError, ServerModels

    (tmp_path / "slots").mkdir()
    cfg = write_models_toml(tmp_path / "models.toml", {"a": {
        "target": "t.gguf", "cache_reuse": False, "cache_ram_mib": 8, "checkpoint_every": 0,
        "slot_save_path": "slots", "synth_len": 3.5}})
    p = ServerModels.from_toml(cfg).presets["a"]
    assert p.slot_save_path == str(tmp_path / "slots")  # relative to the config file
    c = p.cache_config()
    assert (c.reuse, c.ram_mib, c.checkpoint_every) == (False, 8, 0) and p.engine_config().synth_len == 3.5
    for table, words in [({"slot_save_path": "missing"}, "not a directory"), ({"cache_ram_mib": -1}, "ram_mib"),
                         ({"cache_ram_mib": "lots"}, "preset"), ({"synth_len": 3, "drafter": ""}, "synth_len")]:
        write_models_toml(cfg, {"a": {"target": "t.gguf", **table}})
        with pytest.raises(ConfigError, match=words):
            ServerModels.from_toml(cfg)

"""llama-server's native endpoints through a real router and its workers (server/native_api.py, app.py): the shapes
of POST /completion (whole and streamed), GET /props, GET /slots, POST /apply-template; router-mode model control
(GET /models, POST /models/load and /models/unload change the status); /v1/models carries the context, the drafter
and the status."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.helpers.server_util import Server, write_models_toml

N_CTX = 512


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("native") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": N_CTX},
        "plain": {"target": str(pair.target), "drafter": "", "n_slots": 1, "n_ctx_slot": 256},
    }, default="tiny")
    srv = Server(["--config", str(cfg)])
    yield srv
    srv.stop()


def test_completion_shape(server):
    body = {"model": "tiny", "prompt": "the quick brown fox", "n_predict": 6, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": True, "id_slot": -1}
    r = server.http().post("/completion", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stop"] is True and out["stop_type"] == "limit" and out["tokens_predicted"] == 6
    assert len(out["tokens"]) == 6 and isinstance(out["content"], str) and out["content"]
    assert out["tokens_evaluated"] > 1 and out["model"] == "tiny" and out["truncated"] is False
    assert out["generation_settings"]["n_predict"] == 6 and out["generation_settings"]["n_ctx"] == N_CTX
    assert out["timings"]["predicted_n"] == 6 and "prompt_ms" in out["timings"]
    assert isinstance(out["tokens_cached"], int) and out["stopping_word"] == ""


def test_completion_stream_adds_up_to_the_whole(server):
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "n_predict": 8, "temperature": 0, "ignore_eos": True}
    whole = server.http().post("/completion", json=body).json()
    events = []
    with server.http().stream("POST", "/completion", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 8
    assert not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == whole["content"]
    assert sum(len(e["tokens"]) for e in events[:-1]) == 8


def test_completion_refuses_an_unapplied_field(server):
    r = server.http().post("/completion", json={"prompt": "hi", "mirostat": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "mirostat"


def test_props(server):
    r = server.http().get("/props", params={"model": "tiny"})
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == N_CTX
    assert p["default_generation_settings"]["speculative"] is True
    assert p["model_path"].endswith(".gguf") and p["chat_template"] and p["model_alias"] == "tiny"
    assert p["default_generation_settings"]["params"]["n_predict"] == -1


def test_slots_show_a_running_request(server):
    idle = server.http().get("/slots", params={"model": "tiny"}).json()
    assert [s["id"] for s in idle] == [0, 1] and all(s["n_ctx"] == N_CTX for s in idle)
    assert not any(s["is_processing"] for s in idle)
    body = {"model": "tiny", "prompt": "x", "n_predict": 400, "ignore_eos": True, "stream": True, "temperature": 1}
    seen = threading.Event()

    # One request on the tiny model can finish between two polls on a fast machine, so requests run back to back
    # until a poll sees one: the slot is then busy nearly all the time, and only a /slots that never reports a
    # running request fails.
    def busy():
        while not seen.is_set():
            with server.http().stream("POST", "/completion", json=body) as r:
                for _ in r.iter_lines():
                    if seen.is_set():
                        break

    t = threading.Thread(target=busy)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            running = [s for s in server.http().get("/slots", params={"model": "tiny"}).json() if s["is_processing"]]
            if running:
                break
            assert time.monotonic() < deadline, "no slot ever showed the request"
            time.sleep(0.05)
        [s] = running
        assert s["id_task"] >= 0 and s["next_token"]["n_remain"] > 0
    finally:
        seen.set()
        t.join(30)


def test_apply_template(server):
    messages = [{"role": "user", "content": "hello there"}]
    r = server.http().post("/apply-template", json={"model": "tiny", "messages": messages})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "<start_of_turn>user\nhello there<end_of_turn>" in prompt and prompt.endswith("<start_of_turn>model\n")
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    with_tools = server.http().post("/apply-template", json={"messages": messages, "tools": [tool]}).json()["prompt"]
    assert '"name": "lookup"' in with_tools and "```tool_call" in with_tools


def status(server) -> dict:
    return {m["id"]: m["status"]["value"] for m in server.http().get("/models").json()["data"]}


def test_models_load_and_unload(server):
    data = server.http().get("/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny", "plain"] and all(m["path"].endswith(".gguf") for m in data)
    assert status(server) == {"tiny": "loaded", "plain": "unloaded"}
    r = server.http().post("/models/load", json={"model": "plain"})
    assert r.status_code == 200 and r.json() == {"success": True}
    assert status(server) == {"tiny": "loaded", "plain": "loaded"}
    assert server.http().post("/models/unload", json={"model": "plain"}).json() == {"success": True}
    assert status(server)["plain"] == "unloaded"
    again = server.http().post("/models/unload", json={"model": "plain"})
    assert again.status_code == 400 and "not loaded" in again.json()["error"]["message"]
    assert server.http().post("/models/load", json={"model": "nope"}).status_code == 404


def test_v1_models_carry_context_drafter_and_status(server):
    cards = {m.id: m.model_extra["meta"] for m in server.openai().models.list().data}
    assert cards["tiny"]["n_ctx"] == N_CTX and cards["tiny"]["drafter"].endswith(".gguf")
    assert cards["tiny"]["status"] == "loaded" and cards["tiny"]["n_slots"] == 2
    assert cards["plain"]["drafter"] is None and cards["plain"]["n_ctx"] == 256

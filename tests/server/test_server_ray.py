"""pydflash on Ray Serve (``pydflash.server.ray.app``): a local Ray instance, 2 engine replicas, 2 tiny presets.

Clients talk to Serve's HTTP proxy on loopback (the real ``openai`` client and httpx, every call with a timeout).
- greedy completions and chat through the Serve ingress equal those of ``pydflash-server`` on the same presets;
- multiplexing: at one model per replica, each model stays on the replica that loaded it, and ``"any"`` is the
  model this ingress used last;
- a replica actor killed mid-stream gives its client an error event and ``[DONE]``, and the next request succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray[serve] extra is not installed (pip install -e '.[ray]')")
serve = pytest.importorskip("ray.serve", reason="the ray[serve] extra is not installed (pip install -e '.[ray]')")

from tests.helpers.server_util import Server, free_port, write_models_toml  # noqa: E402

TIMEOUT = 30  # seconds, on every client call: a hang fails the test instead of stalling the suite
REPLICA = "x-pydflash-replica"


@pytest.fixture(scope="module")
def models_toml(tiny, tmp_path_factory):
    a, b, c = tiny("gemma3"), tiny("llama"), tiny("qwen3")
    folder = tmp_path_factory.mktemp("serve")
    (folder / "broken.gguf").write_text("not a GGUF file")
    return write_models_toml(folder / "models.toml", {
        "alpha": {"target": str(a.target), "drafter": str(a.drafter), "n_slots": 2, "n_ctx_slot": 2048},
        "beta": {"target": str(b.target), "drafter": str(b.drafter), "n_slots": 2, "n_ctx_slot": 2048},
        "gamma": {"target": str(c.target), "drafter": str(c.drafter), "n_slots": 2, "n_ctx_slot": 2048},
        "broken": {"target": str(folder / "broken.gguf"), "drafter": ""},
    }, default="alpha")


@pytest.fixture(scope="module")
def cluster(models_toml):
    """Serve's proxy on a free loopback port; engine replicas hold one model each, so a request routed to the
    wrong replica would evict and show up as a replica change."""
    from pydflash.server.ray.app import build
    from pydflash.server.preset import ServerModels

    port = free_port()
    saved = dict(os.environ), signal.getsignal(signal.SIGTERM), sys.excepthook
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        models = ServerModels.from_toml(models_toml)
        app = build(models, max_models_per_replica=1, preload=False,
                    engine_options={"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5}})
        serve.run(app, name="pydflash", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        # place the models: alpha on one replica, then (once Serve knows where alpha is: replicas push what they
        # hold every 0.1 s) beta on the replica with the fewest models, the other one
        warm_up(base, pause=0.5)
        yield base
    finally:
        serve.shutdown()
        ray.shutdown()
        # ray.init leaves RAY_* variables, a SIGTERM handler and an excepthook in this (shared) pytest process
        env, sigterm, hook = saved
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, sigterm)
        sys.excepthook = hook


@pytest.fixture(scope="module")
def direct(models_toml):
    srv = Server(["--config", str(models_toml), "--max-resident", "2", "--no-preload"])
    warm_up(srv.base)  # the same history per model as the replicas (slot and prompt-cache state shape batches)
    yield srv
    srv.stop()


def warm_up(base, pause: float = 0.0) -> None:
    for model in ("alpha", "beta"):
        r = complete(base, model)
        assert r.status_code == 200, r.text
        time.sleep(pause)


def http(base):
    import httpx

    return httpx.Client(base_url=base, timeout=TIMEOUT)


def complete(base, model, **kw):
    body = {"model": model, "prompt": "hello world", "max_tokens": 8, "temperature": 0, **kw}
    with http(base) as c:
        return c.post("/v1/completions", json=body)


def openai_client(base):
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


PROMPTS = ["The capital of France is", "def add(a, b):"]
CHAT = [{"role": "user", "content": "Say something."}]
TOKENS = {"return_tokens": True}


def answers(base) -> list[dict]:
    """Greedy completions and chat, streamed and not, for both presets: text, finish reason, usage and token ids."""
    client = openai_client(base)
    out = []
    for model in ("alpha", "beta"):
        r = client.completions.create(model=model, prompt=PROMPTS, max_tokens=24, temperature=0, extra_body=TOKENS)
        for c in sorted(r.choices, key=lambda c: c.index):
            out.append({"model": model, "prompt": PROMPTS[c.index], "text": c.text, "finish": c.finish_reason,
                        "tokens": c.model_extra["tokens"]})
        out[-1]["usage"] = r.usage.model_dump()
        r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0,
                                           extra_body=TOKENS)
        out.append({"model": model, "chat": True, "text": r.choices[0].message.content,
                    "finish": r.choices[0].finish_reason, "usage": r.usage.model_dump(),
                    "tokens": r.choices[0].model_extra["tokens"]})
        chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0,
                                                     stream=True, extra_body=TOKENS))
        frames = [ch.choices[0] for ch in chunks if ch.choices]
        out.append({"model": model, "chat": True, "text": "".join(f.delta.content or "" for f in frames),
                    "tokens": [t for f in frames for t in (f.model_extra.get("tokens") or [])]})
    return out


def prompt_tokens(base, oracle, answer) -> list[int]:
    """The tokens the server decoded from: a completion prompt tokenizes as ``generate`` does; a chat turn is what
    ``/apply-template`` renders, with BOS added unless the template writes it (the server's own rule)."""
    if not answer.get("chat"):
        return oracle.llm.tokenize(answer["prompt"])
    with http(base) as c:
        text = c.post("/apply-template", json={"model": answer["model"], "messages": CHAT}).json()["prompt"]
    model = oracle.model
    bos = model.token_to_piece(model.bos, special=True).decode()
    return model.tokenize(text, add_special=not text.startswith(bos), parse_special=True)


@pytest.fixture(scope="module")
def oracles(tiny):
    from tests.helpers.oracle import Oracle

    made = {"alpha": Oracle(tiny("gemma3").target), "beta": Oracle(tiny("llama").target)}
    yield made
    for o in made.values():
        o.close()


def test_greedy_output_equals_pydflash_server(cluster, direct, oracles):
    """Serve's replicas and pydflash-server run the same engine, but their prompt caches keep different sequences
    (the placement warm-up), so cells, hence rounding, differ: an answer's tokens equal the server's or, where
    they part, the Serve answer is greedy up to tie-flips (the regret gate, re-anchored on the server's tokens)."""
    via_serve, via_direct = answers(cluster), answers(direct.base)
    assert len(via_serve) == len(via_direct)
    prompts = [prompt_tokens(direct.base, oracles[a["model"]], a) for a in via_direct]
    for model in ("alpha", "beta"):  # the oracle's prompts are the ones the server counted
        first, second, chat = [i for i, a in enumerate(via_direct) if a["model"] == model][:3]
        assert via_direct[second]["usage"]["prompt_tokens"] == len(prompts[first]) + len(prompts[second])
        assert via_direct[chat]["usage"]["prompt_tokens"] == len(prompts[chat])
    for mine, theirs, prompt in zip(via_serve, via_direct, prompts):
        assert mine["tokens"], mine  # something was generated
        if mine["tokens"] == theirs["tokens"]:
            assert mine == theirs
            continue
        oracle = oracles[mine["model"]]
        oracle.check(prompt, mine["tokens"], base_tokens=theirs["tokens"])
        assert mine["text"] == oracle.model.detokenize(mine["tokens"]).decode("utf-8", "replace")


def test_each_model_stays_on_its_replica(cluster):
    seen = {"alpha": set(), "beta": set()}
    for _ in range(3):
        for model in ("alpha", "beta"):
            r = complete(cluster, model)
            assert r.status_code == 200 and r.json()["model"] == model, r.text
            seen[model].add(r.headers[REPLICA])
    assert len(seen["alpha"]) == 1 and len(seen["beta"]) == 1, seen
    assert seen["alpha"] != seen["beta"]
    r = complete(cluster, "any")  # the model this ingress used last
    assert r.json()["model"] == "beta" and {r.headers[REPLICA]} == seen["beta"]
    r = complete(cluster, "alpha")
    r = complete(cluster, "any")
    assert r.json()["model"] == "alpha" and {r.headers[REPLICA]} == seen["alpha"]


def test_errors_come_from_the_app(cluster):
    with http(cluster) as c:
        r = c.post("/v1/completions", json={"model": "delta", "prompt": "x"})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        r = c.post("/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = c.post("/v1/completions", json={"model": "alpha", "prompt": [[10**9]], "max_tokens": 2})
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
        r = c.post("/tokenize", json={"model": "beta", "content": "hello"})
        assert r.status_code == 200 and r.json()["tokens"]
        models = c.get("/v1/models").json()["data"]
        assert {m["id"]: m["meta"]["resident"] for m in models} == {"alpha": True, "beta": True, "gamma": False,
                                                                    "broken": False}
        r = c.post("/v1/completions", json={"model": "broken", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"], r.text
        assert "retry-after" in r.headers


def stream_frames(base, model, out: list, started: threading.Event) -> None:
    body = {"model": model, "prompt": "hello", "max_tokens": 400, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with http(base) as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                if len(out) == 3:
                    started.set()


def test_eviction_lets_running_streams_finish(cluster):
    """Both replicas stream (alpha, beta); gamma then evicts one of them mid-stream: both streams still end with
    their finish_reason and [DONE], and the evicted model loads again on request."""
    frames = {"alpha": [], "beta": []}
    started = {m: threading.Event() for m in frames}
    threads = [threading.Thread(target=stream_frames, args=(cluster, m, frames[m], started[m])) for m in frames]
    for t in threads:
        t.start()
    assert all(e.wait(TIMEOUT) for e in started.values())
    r = complete(cluster, "gamma")
    assert r.status_code == 200, r.text
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    for model, fs in frames.items():
        assert fs[-1] == "[DONE]", (model, fs[-2:])
        assert json.loads(fs[-2])["choices"][0]["finish_reason"] == "length", (model, fs[-2])
    for model in ("alpha", "beta", "gamma"):
        r = complete(cluster, model)
        assert r.status_code == 200 and r.json()["model"] == model, r.text


def test_replica_killed_mid_stream(cluster):
    frames = []
    body = {"model": "alpha", "prompt": "hello", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with http(cluster) as c, c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        victim = r.headers[REPLICA]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            frames.append(line[6:])
            if len(frames) == 3:
                ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    assert frames[-1] == "[DONE]"
    err = json.loads(frames[-2])["error"]
    assert err["code"] == 503 and err["type"] == "unavailable_error", frames[-2]
    assert len(frames) < 1500  # the stream was cut, not finished
    r = complete(cluster, "alpha")  # the next request: Serve routes it to the live replica, which loads alpha
    assert r.status_code == 200, r.text
    assert r.headers[REPLICA] != victim

"""pydflash-server end to end: a real uvicorn on loopback, worker processes, the real `openai` client.

Two presets share one tiny Gemma-3 target: ``spec`` (with its DFlash drafter) and ``plain`` (no drafter). Greedy
output through the server with speculation must equal plain greedy decoding, judged by the regret gate.
"""

from __future__ import annotations

import concurrent.futures as cf
import json

import numpy as np
import pytest

from tests.helpers.oracle import Oracle
from tests.helpers.server_util import Server, write_models_toml

PROMPTS = ["hello world, the quick brown fox", "def add(a, b):\n    return a + b\n", "Once upon a time there was",
           "1, 2, 3, 4, 5, 6,"]


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("srv") / "models.toml", {
        "spec": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 4, "n_ctx_slot": 512},
        "plain": {"target": str(pair.target), "drafter": "", "n_slots": 4, "n_ctx_slot": 512},
        # a fixed block: the random tiny drafter is useless, so adaptive drafting soon stops drafting
        "fixed": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 4, "n_ctx_slot": 512,
                  "draft_adaptive": False},
    }, default="spec")
    srv = Server(["--config", str(cfg), "--max-resident", "3"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oracle(pair):
    o = Oracle(pair.target)
    yield o
    o.close()


def complete(server, model, prompt, **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "return_tokens": True, **kw}
    r = server.http().post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, path, body):
    """The raw SSE frames of a streamed request, as parsed JSON (and the literal [DONE])."""
    frames = []
    with server.http().stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                frames.append(data if data == "[DONE]" else json.loads(data))
    return frames


def test_completions_lossless_and_drafting(server, oracle):
    drafted = 0
    for prompt in PROMPTS:
        spec = complete(server, "spec", prompt)
        plain = complete(server, "plain", prompt)
        toks = oracle.llm.tokenize(prompt)
        plain_tokens = plain["choices"][0]["tokens"]
        assert plain_tokens == oracle.greedy(toks, len(plain_tokens), ignore_eos=False)
        oracle.check(toks, spec["choices"][0]["tokens"], base_tokens=plain["choices"][0]["tokens"])
        assert spec["model"] == "spec" and spec["object"] == "text_completion"
        u = spec["usage"]
        assert u["prompt_tokens"] == len(toks)
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert "cached_tokens" in u["prompt_tokens_details"]
        drafted += spec["timings"]["draft_n"]
        assert plain["timings"]["draft_n"] == 0
        # the engine's step split (a pydflash extension): every generated token came from a step
        for t, n in ((spec["timings"], u["completion_tokens"]),
                     (plain["timings"], plain["usage"]["completion_tokens"])):
            assert 1 <= t["steps"] <= n and t["verify_ms"] > 0 and t["draft_steps"] <= t["steps"]
        assert plain["timings"]["draft_steps"] == 0 and plain["timings"]["draft_ms"] == 0
    assert drafted > 0  # speculation really ran through the server


def test_stream_equals_non_stream_completions(server):
    body = {"model": "spec", "prompt": PROMPTS[2], "max_tokens": 40, "temperature": 0,
            "stream_options": {"include_usage": True}}
    whole = complete(server, "spec", PROMPTS[2], max_tokens=40)["choices"][0]["text"]
    frames = sse(server, "/v1/completions", body)
    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert len({c["id"] for c in chunks}) == 1
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    text_chunks = chunks[:-1]
    finishes = [c["choices"][0]["finish_reason"] for c in text_chunks if c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and text_chunks[-1]["choices"][0]["finish_reason"] == finishes[0]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == whole


def test_chat_with_openai_client_streamed_and_not(server, oracle):
    from pydflash.server import chat

    client = server.openai()
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    extra = {"return_tokens": True}
    full = client.chat.completions.create(model="spec", messages=msgs, max_tokens=30, temperature=0,
                                          extra_body=extra)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    plain = client.chat.completions.create(model="plain", messages=msgs, max_tokens=30, temperature=0,
                                           extra_body=extra)
    stream = client.chat.completions.create(model="spec", messages=msgs, max_tokens=30, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body=extra)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == []
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("tokens") or [])]
    assert joined == oracle.model.detokenize(streamed).decode("utf-8", "replace")
    # speculation on and off agree up to tie-flips: the prompt is what the server rendered (gemma fallback)
    model = oracle.model
    tmpl = chat.resolve(None, "gemma3", None, bos_token=model.token_to_piece(model.bos, special=True).decode(),
                        eos_token=model.token_to_piece(model.eos, special=True).decode())
    text = tmpl.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}])
    prompt = model.tokenize(text, add_special=not tmpl.emits_bos, parse_special=True)
    assert full.usage.prompt_tokens == len(prompt)
    # kept sequences of the prompt cache move cells, hence rounding: stream and non-stream agree up to tie-flips
    for tokens in (full.choices[0].model_extra["tokens"], streamed):
        oracle.check(prompt, tokens, base_tokens=plain.choices[0].model_extra["tokens"])


def test_sixteen_clients_on_four_slots(server, oracle):
    prompts = [PROMPTS[i % 4] + " " * (i // 4) for i in range(16)]
    with cf.ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda p: complete(server, "fixed", p, max_tokens=20 + len(p) % 7), prompts))
    assert sum(o["timings"]["draft_n"] for o in outs) > 0
    for prompt, out in zip(prompts, outs):
        toks = oracle.llm.tokenize(prompt)
        oracle.check(toks, out["choices"][0]["tokens"],
                     base_tokens=oracle.greedy(toks, len(out["choices"][0]["tokens"]), ignore_eos=False))


def test_stop_string_inside_the_output(server):
    whole = complete(server, "spec", PROMPTS[0], max_tokens=40)["choices"][0]["text"]
    assert len(whole) > 12
    stop = whole[8:11]
    cut = whole[: whole.index(stop)]
    out = complete(server, "spec", PROMPTS[0], max_tokens=40, stop=[stop])
    assert out["choices"][0]["text"] == cut and out["choices"][0]["finish_reason"] == "stop"
    frames = sse(server, "/v1/completions", {"model": "spec", "prompt": PROMPTS[0], "max_tokens": 40,
                                             "temperature": 0, "stop": stop})
    assert "".join(f["choices"][0]["text"] for f in frames[:-1]) == cut


def test_lm_eval_loglikelihood_request(server, oracle):
    """lm-eval's local-completions: token-id prompt, seed, stop, max_tokens=1, logprobs=1, echo=True."""
    toks = oracle.llm.tokenize(PROMPTS[1])
    r = server.http().post("/v1/completions", json={
        "model": "spec", "prompt": toks, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True,
        "seed": 1234, "stop": ["\n\n"]})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    n_gen = r.json()["usage"]["completion_tokens"]
    assert len(lp["token_logprobs"]) == len(toks) + n_gen
    assert lp["token_logprobs"][0] is None
    for i in (1, len(toks) // 2, len(toks) - 1):  # the prompt's log-probabilities equal the target's
        logits = oracle.logits_after(toks[:i]).astype(np.float64)
        ref = logits[toks[i]] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert abs(lp["token_logprobs"][i] - ref) < 1e-3
        assert max(lp["top_logprobs"][i].values()) >= lp["token_logprobs"][i] - 1e-6
    assert r.json()["choices"][0]["text"].startswith(oracle.llm.detokenize(toks)[:10])


def test_streamed_logprobs(server, oracle):
    """Each chunk carries its own tokens' logprobs: together they are the target's log-probabilities of the
    streamed tokens, offsets and all, as a non-streamed answer gives them; with echo the prompt's come first."""
    toks = oracle.llm.tokenize(PROMPTS[2])
    body = {"model": "spec", "prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0, "logprobs": 2,
            "return_tokens": True}
    frames = [f for f in sse(server, "/v1/completions", body)[:-1] if f["choices"]]
    gen = [t for f in frames for t in f["choices"][0].get("tokens") or []]
    parts = [f["choices"][0]["logprobs"] for f in frames if f["choices"][0]["logprobs"]]
    assert len(parts) > 1 and len(gen) == 16
    joined = {k: [x for part in parts for x in part[k]] for k in ("tokens", "token_logprobs", "text_offset")}
    assert "".join(joined["tokens"]) == "".join(f["choices"][0]["text"] for f in frames)
    for j, t in enumerate(gen):
        logits = oracle.logits_after(toks + gen[:j]).astype(np.float64)
        ref = logits[t] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        # a frame decodes a few tokens at a time, the oracle the whole text: ~1e-3 of rounding apart on a CPU
        assert abs(joined["token_logprobs"][j] - ref) < 1e-2
    assert all(len(top) == 2 for part in parts for top in part["top_logprobs"])
    # the same tokens scored in one piece: offsets and values agree with the non-streamed format
    whole = server.http().post("/v1/completions", json={**body, "prompt": toks + gen, "max_tokens": 1,
                                                         "echo": True}).json()["choices"][0]["logprobs"]
    assert joined["text_offset"] == [o - whole["text_offset"][len(toks)] for o in whole["text_offset"][len(toks):][:16]]
    echoed = [f for f in sse(server, "/v1/completions", {**body, "echo": True})[:-1] if f["choices"]]
    head = echoed[0]["choices"][0]["logprobs"]
    assert head["token_logprobs"][0] is None and len(head["tokens"]) == len(toks)
    client = server.openai()
    msgs = [{"role": "user", "content": "Say something."}]
    chunks = [c for c in client.chat.completions.create(model="spec", messages=msgs, max_tokens=12, temperature=0,
                                                        stream=True, logprobs=True, top_logprobs=3,
                                                        extra_body={"return_tokens": True}) if c.choices]
    content = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    n = sum(len(c.choices[0].model_extra.get("tokens") or []) for c in chunks)
    assert n > 0 and len(content) == n and all(len(e.top_logprobs) == 3 for e in content)
    assert all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in content)


def test_tokenize_detokenize_models_health_metrics(server):
    h = server.http()
    toks = h.post("/tokenize", json={"model": "spec", "content": "hello world"}).json()["tokens"]
    assert toks and h.post("/detokenize", json={"model": "spec", "tokens": toks}).json()["content"] == "hello world"
    models = server.openai().models.list()
    assert {m.id for m in models.data} == {"spec", "plain", "fixed"}
    assert h.get("/health").status_code == 200
    assert server.metric("pydflash_requests_total", model="spec") > 0
    assert server.metric("pydflash_draft_tokens_total", model="spec") > 0
    assert server.metric("pydflash_slots_total", model="spec") == 4
    assert server.metric("pydflash_time_to_first_token_seconds_count", model="spec") > 0
    assert server.metric("pydflash_models_resident") == 3


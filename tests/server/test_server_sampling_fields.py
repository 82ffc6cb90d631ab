"""The sampling controls through a real uvicorn and the real ``openai`` client: logit_bias (OpenAI's and
llama-server's forms) removes a token, grammar / json_schema / response_format constrain the text, penalties keep
speculative sampling's distribution (chi-square against plain sampling through the same server), and what the
engine refuses is a 400 naming the client's field."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import openai
import pytest

from tests.engine.test_rejection_sampling import _chi_square_ok
from tests.helpers.server_util import Server, write_models_toml

PROMPT = "the quick brown fox"
CHAT = [{"role": "user", "content": "hello"}]
# bounded, so that the tiny random model's output ends within max_tokens
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("sampling") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": 512},
    })
    srv = Server(["--config", str(cfg)])
    yield srv
    srv.stop()


def _greedy(client, **extra):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, "return_tokens": True, **extra})
    return out.choices[0].tokens if hasattr(out.choices[0], "tokens") else out.choices[0].model_extra["tokens"]


def test_logit_bias_removes_a_token_in_every_form(server):
    client = server.openai()
    plain = _greedy(client)
    first = plain[0]
    for bias in ({str(first): -100}, [[first, -100]], [[first, False]]):
        toks = _greedy(client, logit_bias=bias)
        assert first not in toks, (bias, toks)
    # llama-server's text form: the bias goes to every token of the text (one whose text is that token alone)
    http = server.http()
    pieces = {t: http.post("/detokenize", json={"tokens": [t]}).json()["content"] for t in set(plain)}
    tok = next(t for t, s in pieces.items() if http.post("/tokenize", json={"content": s}).json()["tokens"] == [t])
    assert tok not in _greedy(client, logit_bias=[[pieces[tok], False]])
    assert tok not in _greedy(client, logit_bias={pieces[tok]: -100})
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True, "return_tokens": True})
    banned = chat.choices[0].model_extra["tokens"][0]
    again = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0,
                                           logit_bias={str(banned): -100},
                                           extra_body={"ignore_eos": True, "return_tokens": True})
    assert banned not in again.choices[0].model_extra["tokens"]


def test_a_logit_bias_past_the_vocabulary_is_a_400_naming_it(server):
    with pytest.raises(openai.BadRequestError) as info:
        server.openai().completions.create(model="tiny", prompt=PROMPT, max_tokens=2, logit_bias={"99999999": 5})
    assert info.value.param == "logit_bias"


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_parses_and_validates(server, stream):
    client = server.openai()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kw = dict(model="tiny", messages=CHAT, max_tokens=200, temperature=0.8, seed=3, response_format=fmt)
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        out = client.chat.completions.create(**kw)
        assert out.choices[0].finish_reason == "stop"
        text = out.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_grammar_and_llama_server_json_schema(server):
    client = server.openai()
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=200, temperature=0,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(out.choices[0].text), dict)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=200, temperature=0,
                                    extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(out.choices[0].text), PERSON)
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=1.0, seed=1,
                                    extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert out.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("extra,param", [
    ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos"),
    ({"ignore_eos": True, "grammar": 'root ::= "a"'}, "ignore_eos"),
    ({"grammar": "root ::= nowhere"}, "grammar"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "string"}}, "grammar"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "response_format"),
    ({"mirostat": 2}, "mirostat"),
    ({"best_of": 2}, "best_of"),
])
def test_conflicts_are_400s_naming_the_field(server, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        server.openai().completions.create(model="tiny", prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert info.value.param == param, info.value.body


def _histogram(client, prompt: list[int], kw: dict, rounds: int, batch: int) -> Counter:
    """First three tokens of rounds x batch unseeded samples (a list prompt: one choice per copy)."""
    hist = Counter()
    for _ in range(rounds):
        out = client.completions.create(model="tiny", prompt=[prompt] * batch, max_tokens=3, temperature=0.7,
                                        extra_body={"top_k": 4, "ignore_eos": True, "return_tokens": True, **kw})
        hist.update(tuple(c.model_extra["tokens"]) for c in out.choices)
    return hist


def test_penalties_keep_the_sampling_distribution(server):
    """Penalties change p at tokens 2 and 3 through the tokens before them, drafted ones included: speculative
    sampling's first three tokens against plain sampling (speculative.enabled false) with the same penalties, on
    the same server (chi-square at alpha 1e-3), and the penalties must move the histogram."""
    client = server.openai()
    prompt = server.http().post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    # the prompt ends with its own greedy continuation, the tokens sampling picks most: the penalties then bite from
    # the first token (greedy, so the prompt is the same every run and the power check below does not depend on a
    # random first histogram)
    greedy = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True, "return_tokens": True})
    prompt = prompt + greedy.choices[0].model_extra["tokens"]
    # strong: the tiny random target's logits have wide margins
    pen = {"presence_penalty": 2, "frequency_penalty": 2, "repeat_penalty": 5, "repeat_last_n": -1}
    want = _histogram(client, prompt, {**pen, "speculative": {"enabled": False}}, rounds=4, batch=60)
    got = _histogram(client, prompt, pen, rounds=4, batch=60)
    ok, msg = _chi_square_ok(want, got)
    assert ok, (msg, want.most_common(5), got.most_common(5))
    free = _histogram(client, prompt, {"speculative": {"enabled": False}}, rounds=4, batch=60)
    assert not _chi_square_ok(free, got)[0], (free.most_common(6), got.most_common(6))


@pytest.mark.real_model
def test_default_pair_json_schema_validates():
    srv = Server(["-np", "1", "-c", "2048"], ready_timeout=300)
    try:
        client = srv.openai(timeout=300)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        out = client.chat.completions.create(model="any", max_tokens=120, temperature=0, response_format=fmt,
                                             messages=[{"role": "user", "content": "Ada is 36. As JSON:"}])
        jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
        assert out.model_extra["timings"]["draft_n"] > 0  # speculation stayed on
    finally:
        srv.stop()


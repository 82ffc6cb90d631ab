"""Bad input against a live server: every case a 4xx in the OpenAI envelope before any
generation or SSE byte, and the server keeps serving afterwards."""

from __future__ import annotations

import pytest

from tests.helpers.server_util import Server, write_models_toml

N_CTX = 256
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    cfg = write_models_toml(d / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": N_CTX},
        # a second preset (never loaded here): with one preset any model name would be served
        "other": {"target": str(pair.target), "drafter": "", "n_slots": 1, "n_ctx_slot": N_CTX},
    }, default="tiny")
    log = open(d / "server.log", "wb")
    srv = Server(["--config", str(cfg), "--max-body-mb", "1", "-v"], log=log)
    srv.log_path = d / "server.log"
    yield srv
    srv.stop()


def assert_envelope(r, status, type_=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"]
    if type_:
        assert err["type"] == type_
    return err


GOOD_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

RAW_BODIES = ["json{{{", "[]", "[1, 2]", "42", "null", '"text"', ""]
BAD_CHAT = [
    {"messages": None}, {"messages": "hello"}, {"messages": [123]}, {"messages": [{}]},
    {"messages": [{"role": 5, "content": "x"}]}, {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": []},
    {"max_tokens": 0}, {"max_tokens": -3}, {"temperature": -0.1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1},
    {"sampling_mode": "typical"}, {"sampling_mode": 1},
    {"n": 0}, {"response_format": {"type": "json_schema"}}, {"response_format": {"type": "grammar"}},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
]
BAD_COMPLETION = [
    {"prompt": ""}, {"prompt": []}, {"prompt": [[]]}, {"prompt": [-1, 5]}, {"prompt": None}, {"prompt": 7},
    {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "logprobs": 9}, {"prompt": "x", "stop": 3},
]


@pytest.mark.parametrize("raw", RAW_BODIES)
def test_not_a_json_object(server, raw):
    r = server.http().post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert_envelope(r, 400, "invalid_request_error")


def test_form_urlencoded_body(server):
    r = server.http().post("/v1/completions", data={"prompt": "hi", "model": "tiny"})
    assert_envelope(r, 400, "invalid_request_error")


@pytest.mark.parametrize("patch", BAD_CHAT, ids=lambda p: str(p)[:40])
def test_bad_chat_fields(server, patch):
    assert_envelope(server.http().post("/v1/chat/completions", json={**GOOD_CHAT, **patch}), 400)


@pytest.mark.parametrize("patch", BAD_COMPLETION, ids=lambda p: str(p)[:40])
def test_bad_completion_fields(server, patch):
    assert_envelope(server.http().post("/v1/completions", json={"model": "tiny", **patch}), 400)


def test_token_ids_outside_the_vocabulary(server, pair):
    for stream in (False, True):
        r = server.http().post("/v1/completions", json={"model": "tiny", "prompt": [1, pair.n_vocab],
                                                        "stream": stream})
        assert "outside the vocabulary" in assert_envelope(r, 400, "invalid_request_error")["message"]


def test_context_boundary(server, pair):
    """n_ctx_slot - max_tokens - block tokens fit; one more is exceed_context_size_error, before any SSE byte."""
    fits = N_CTX - MAX_TOKENS - pair.block_size
    h = server.http()
    ok = h.post("/v1/completions", json={"model": "tiny", "prompt": [5] * fits, "max_tokens": MAX_TOKENS,
                                         "temperature": 0})
    assert ok.status_code == 200, ok.text
    for stream in (False, True):
        with h.stream("POST", "/v1/completions", json={"model": "tiny", "prompt": [5] * (fits + 1),
                                                       "max_tokens": MAX_TOKENS, "stream": stream}) as r:
            r.read()
            assert r.headers["content-type"].startswith("application/json")
            assert_envelope(r, 400, "exceed_context_size_error")


def test_lone_surrogate(server):
    raw = '{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = server.http().post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert_envelope(r, 400)
    raw = '{"model": "tiny", "prompt": "x", "stop": ["\\udfff"]}'
    assert_envelope(server.http().post("/v1/completions", content=raw,
                                       headers={"content-type": "application/json"}), 400)


def test_oversized_body_is_413(server):
    big = b'{"model": "tiny", "prompt": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    r = server.http().post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert_envelope(r, 413)

    def chunks():  # no Content-Length: refused once the limit is passed
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    r = server.http().post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_envelope(r, 413)


@pytest.mark.parametrize("name", ["../x", "/abs.gguf", "%2e%2e%2f", "a\x00b", "\uff0fetc", "m" * 300,
                                  "tiny\r\nX-Injected: 1", "models.toml"])
def test_model_names_are_only_looked_up(server, name):
    r = server.http().post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2})
    err = assert_envelope(r, 404, "not_found_error")
    assert "'tiny'" in err["message"] and "'other'" in err["message"]  # the served names, to pick from


def test_single_model_is_served_under_any_name(keyed):
    """One preset: any model name gets it (as llama-server; clients hard-code names), and says which."""
    h = keyed.http()
    for name in ("gpt-4o", "../x", "tiny"):
        r = h.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny"
    r = h.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == "tiny", r.text


def test_crlf_in_model_names_is_escaped_in_logs(server):
    server.http().post("/v1/completions", json={"model": "evil\r\nFORGED LOG LINE", "prompt": "hi"})
    server.http().post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1})
    assert not any(line.startswith("FORGED") for line in server.log_path.read_text(errors="replace").splitlines())


def test_unknown_route_and_method(server):
    assert_envelope(server.http().get("/v1/nothing"), 404, "not_found_error")
    assert server.http().get("/v1/completions").status_code == 405


def test_hundred_invalid_then_valid(server):
    h = server.http()
    for i in range(100):
        assert h.post("/v1/chat/completions", json={**GOOD_CHAT, "max_tokens": -i}).status_code == 400
    ok = h.post("/v1/chat/completions", json={**GOOD_CHAT, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
    assert h.get("/health").status_code == 200


def test_openai_client_sees_typed_errors(server):
    import openai

    client = server.openai()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    # bad input in a stream is a 400 before the stream starts (the client raises, it does not iterate)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=[1] * N_CTX, max_tokens=4, stream=True)


@pytest.fixture(scope="module")
def keyed(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("key") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": "", "n_slots": 1, "n_ctx_slot": 128}})
    srv = Server(["--config", str(cfg)], api_key="s3cret")
    yield srv
    srv.stop()


def test_api_key(keyed):
    import httpx

    bare = httpx.Client(base_url=keyed.base)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    assert_envelope(bare.post("/v1/completions", json=body), 401, "authentication_error")
    assert_envelope(bare.post("/v1/completions", json=body, headers={"Authorization": "Bearer wrong"}), 401)
    assert_envelope(bare.get("/v1/models"), 401)
    assert_envelope(bare.get("/metrics"), 401)
    assert bare.get("/health").status_code == 200  # public: PUBLIC_ROUTES
    assert keyed.http().post("/v1/completions", json=body).status_code == 200

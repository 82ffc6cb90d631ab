"""The error envelope and the class -> status mapping, through a tiny FastAPI app (no model): every bad body is a
400 in the OpenAI envelope (never FastAPI's 422), unknown routes are 404s in the envelope, internals never leak."""

import logging

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from pydflash import errors as core
from pydflash.server import errors as E
from pydflash.server.schemas import ChatCompletionRequest, CompletionRequest


def make_app():
    app = FastAPI()
    E.install(app)

    @app.post("/v1/completions", responses=E.responses(400, 404))
    def completions(req: CompletionRequest):
        return {"ok": req.prompts()}

    @app.post("/v1/chat/completions")
    def chat(req: ChatCompletionRequest):
        return {"ok": len(req.messages)}

    @app.get("/v1/models/{name}")
    def model(name: str):
        raise HTTPException(404, f"model {name!r} not found")

    @app.post("/raise/{what}")
    def raise_(what: str):
        raise {
            "overflow": core.ContextOverflow("prompt (900 tokens) + max_tokens (200) > n_ctx_slot (1024)"),
            "invalid": core.InvalidRequest("token id 999999 >= n_vocab (262144)"),
            "load": core.ModelLoadError("/secret/path/model.gguf: not a GGUF"),
            "kvfull": core.KVSlotFull(1, "llama_decode"),
            "bug": RuntimeError("secret internals"),
            "notfound": E.NotFoundError("model 'x' not found", param="model"),
            "busy": E.Overloaded(retry_after=3),
            "down": E.Unavailable("model 'gemma' is restarting", retry_after=2),
            "auth": E.AuthenticationError(),
        }[what]

    return app


@pytest.fixture(scope="module")
def client():
    return TestClient(make_app(), raise_server_exceptions=False)


def check_envelope(r, status, type_):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_ and err["code"] == status and err["message"]
    return err


@pytest.mark.parametrize("content", [b"json{{{", b"[]", b'[{"prompt": "x"}]', b"42", b"null", b'"prompt"', b"",
                                     b'{"prompt": "x"', b"\xff\xfe{}"])
def test_bad_bodies_are_400_in_the_envelope(client, content):
    r = client.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    check_envelope(r, 400, "invalid_request_error")


def test_invalid_json_message(client):
    r = client.post("/v1/completions", content=b"json{{{", headers={"Content-Type": "application/json"})
    assert "not valid JSON" in check_envelope(r, 400, "invalid_request_error")["message"]


@pytest.mark.parametrize("content", [b"[]", b"42", b"null"])
def test_non_object_body_message(client, content):
    r = client.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert "must be a JSON object" in check_envelope(r, 400, "invalid_request_error")["message"]


def test_form_urlencoded_rejected(client):
    r = client.post("/v1/completions", data={"prompt": "hi"})  # what `curl -d` sends
    assert "JSON object" in check_envelope(r, 400, "invalid_request_error")["message"]


def test_field_error_names_the_field(client):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    err = check_envelope(r, 400, "invalid_request_error")
    assert err["param"] == "max_tokens" and "greater than or equal to 1" in err["message"]


def test_nested_field_path_skips_union_tags(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"},
                                                               {"role": "user", "content": 5}]})
    err = check_envelope(r, 400, "invalid_request_error")
    assert err["param"] == "messages[1].content"
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "image"}]}]})
    err = check_envelope(r, 400, "invalid_request_error")
    assert err["param"] == "messages[0].content" and "only text content" in err["message"]


@pytest.mark.parametrize("message,expected", [({}, "is required"), ({"role": 5, "content": "x"}, "must be one of"),
                                              ({"role": "robot", "content": "x"}, "(got 'robot')")])
def test_bad_role_names_the_role(client, message, expected):
    err = check_envelope(client.post("/v1/chat/completions", json={"messages": [message]}),
                         400, "invalid_request_error")
    assert err["param"] == "messages[0].role" and expected in err["message"]


def test_several_bad_fields_are_counted(client):
    err = check_envelope(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                   "n": 0, "top_p": 5, "top_k": -1}),
                         400, "invalid_request_error")
    assert err["message"].endswith("(and 2 more invalid fields)")


def test_missing_field_is_named(client):
    err = check_envelope(client.post("/v1/chat/completions", json={"messages": [{"role": "user"}]}),
                         400, "invalid_request_error")
    assert err["param"] == "messages[0].content" and "required" in err["message"].lower()


def test_lone_surrogate_body_is_400(client):
    r = client.post("/v1/completions", content=b'{"prompt": "\\ud800"}',
                    headers={"Content-Type": "application/json"})
    err = check_envelope(r, 400, "invalid_request_error")
    assert err["param"] == "prompt" and "Unicode" in err["message"]


def test_valid_request_passes(client):
    r = client.post("/v1/completions", json={"prompt": [[1, 2], [3]], "seed": 1, "logprobs": 5, "echo": True})
    assert r.status_code == 200 and r.json() == {"ok": [[1, 2], [3]]}


def test_unknown_route_is_404_envelope(client):
    err = check_envelope(client.get("/v2/nothing"), 404, "not_found_error")
    assert "/v2/nothing" in err["message"]


def test_http_exception_detail_is_kept(client):
    assert check_envelope(client.get("/v1/models/x"), 404, "not_found_error")["message"] == "model 'x' not found"


def test_wrong_method_is_405_envelope(client):
    r = client.get("/v1/completions")
    assert "GET is not allowed" in check_envelope(r, 405, "invalid_request_error")["message"]
    assert "POST" in r.headers.get("allow", "")


@pytest.mark.parametrize("what,status,type_", [
    ("overflow", 400, "exceed_context_size_error"),
    ("invalid", 400, "invalid_request_error"),
    ("notfound", 404, "not_found_error"),
    ("auth", 401, "authentication_error"),
    ("busy", 429, "rate_limit_error"),
    ("down", 503, "unavailable_error"),
    ("kvfull", 503, "unavailable_error"),
    ("load", 500, "server_error"),
    ("bug", 500, "server_error"),
])
def test_exception_classes_map_to_statuses(client, what, status, type_):
    check_envelope(client.post(f"/raise/{what}"), status, type_)


def test_retry_after_and_auth_headers(client):
    assert client.post("/raise/busy").headers["retry-after"] == "3"
    assert client.post("/raise/down").headers["retry-after"] == "2"
    assert client.post("/raise/auth").headers["www-authenticate"] == "Bearer"


def test_internals_do_not_leak_but_are_logged(client, caplog):
    with caplog.at_level(logging.ERROR, logger="pydflash.server.errors"):
        r = client.post("/raise/bug")
        load = client.post("/raise/load")
    assert "secret" not in r.text and "secret" not in load.text
    assert any("RuntimeError" in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_to_api_error_passes_api_errors_through():
    err = E.NotFoundError("model 'x' not found", param="model")
    assert E.to_api_error(err) is err
    assert E.envelope(err) == {"error": {"message": "model 'x' not found", "type": "not_found_error",
                                         "param": "model", "code": 404}}


def test_pydantic_validation_error_maps_to_400():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x", "top_p": 2})
    err = E.to_api_error(info.value)
    assert (err.status, err.type, err.param) == (400, "invalid_request_error", "top_p")


def test_response_model_validation_error_is_ours_not_the_clients(caplog):
    from pydantic import ValidationError

    from pydflash.server.schemas import CompletionChoice

    with pytest.raises(ValidationError) as info:
        CompletionChoice(index=0, text="x", finish_reason="eos")
    with caplog.at_level(logging.ERROR, logger="pydflash.server.errors"):
        err = E.to_api_error(info.value)
    assert (err.status, err.type) == (500, "server_error") and "eos" not in err.message


def test_payload_too_large():
    err = E.PayloadTooLarge(1024)
    assert (err.status, err.type) == (413, "invalid_request_error") and "1024" in err.message


@pytest.mark.parametrize("raw,safe", [
    ("gemma\r\nINFO fake line", "gemma\\x0d\\x0aINFO fake line"),
    ("a\x00b\x1b[31m", "a\\x00b\\x1b[31m"),
    ("x\u2028y\x85", "x\\u2028y\\x85"),
    ("\ud800", "\\ud800"),
    ("back\\slash", "back\\\\slash"),
    ("caf\u00e9/\uff0f", "caf\u00e9/\uff0f"),
])
def test_log_safe(raw, safe):
    assert E.log_safe(raw) == safe
    assert "\n" not in E.log_safe(raw) and "\r" not in E.log_safe(raw)


def test_log_safe_truncates():
    out = E.log_safe("x" * 1000, limit=10)
    assert out.startswith("x" * 10) and "990" in out and len(out) < 40


def test_openapi_documents_error_bodies():
    schema = make_app().openapi()
    op = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert op["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")

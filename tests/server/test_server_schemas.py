"""Request validation of the OpenAI-compatible API: bad inputs are refused with a clear reason, and
what real clients (openai, lm-eval) send is accepted. Pure pydantic: no model, no HTTP."""

import json
import re
import math

import pytest
from pydantic import ValidationError

from pydflash.server import schemas as S

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def errors_of(cls, body):
    with pytest.raises(ValidationError) as info:
        cls.model_validate(body)
    return info.value.errors()


def messages_of(cls, body):
    return " | ".join(e["msg"] for e in errors_of(cls, body))


def parse_json(text):
    """As the server sees a body: Python's json (which accepts lone surrogates and NaN)."""
    return json.loads(text)


# --- bad input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("messages", [None, "hi", [123], [{}], [{"role": 5, "content": "x"}],
                                      [{"role": "user", "content": 5}], [], [{"role": "tool", "content": "x"}],
                                      [{"role": "user", "content": None}], [{"role": "user"}],
                                      [{"role": "user", "content": {"text": "x"}}]])
def test_bad_messages_rejected(messages):
    errs = errors_of(S.ChatCompletionRequest, {"messages": messages})
    assert errs[0]["loc"][0] == "messages"


def test_missing_messages_rejected():
    assert errors_of(S.ChatCompletionRequest, {})[0]["loc"] == ("messages",)


def test_non_text_content_part_says_only_text():
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert "only text content is supported" in messages_of(S.ChatCompletionRequest, body)


@pytest.mark.parametrize("field,value", [("max_tokens", 0), ("max_tokens", -3), ("temperature", -0.1),
                                         ("temperature", float("nan")), ("temperature", float("inf")),
                                         ("top_p", 0), ("top_p", 1.5), ("top_k", -1), ("max_tokens", "16"),
                                         ("max_tokens", True), ("max_tokens", 2.5), ("seed", "1"),
                                         ("stream", "yes"), ("logprobs", 6), ("logprobs", -1)])
def test_bad_sampling_fields_rejected(field, value):
    errs = errors_of(S.CompletionRequest, {"prompt": "x", field: value})
    assert errs[0]["loc"][0] == field


@pytest.mark.parametrize("field,value", [("max_tokens", 0), ("max_completion_tokens", 0), ("temperature", -1),
                                         ("top_p", 0), ("top_k", -1), ("top_logprobs", 6)])
def test_bad_chat_sampling_fields_rejected(field, value):
    assert errors_of(S.ChatCompletionRequest, {**CHAT, field: value})[0]["loc"][0] == field


def test_n_is_a_positive_integer():
    """n > 1 is applied (the worker caps it at the preset's slots); 0, booleans and strings are refused by name."""
    assert S.CompletionRequest.model_validate({"prompt": "x", "n": 3}).n == 3
    assert S.CompletionRequest.model_validate({"prompt": "x", "n": 1}).n == 1
    for bad in (0, -1, True, "2"):  # true is not 1
        assert errors_of(S.CompletionRequest, {"prompt": "x", "n": bad})[0]["loc"][0] == "n"


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_penalties_within_openais_range(field):
    for ok in (0, 0.5, -2, 2, None):
        S.ChatCompletionRequest.model_validate({**CHAT, field: ok})
    for bad in (2.5, -3, "1"):
        assert errors_of(S.ChatCompletionRequest, {**CHAT, field: bad})[0]["loc"][0] == field


def test_response_format_kinds():
    """text, json_object and json_schema (with its schema) are applied; anything else is refused by name."""
    for fmt in ({"type": "text"}, {"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        S.ChatCompletionRequest.model_validate({**CHAT, "response_format": fmt})
    for bad in ({"type": "yaml"}, {"type": "json_schema"}):  # a json_schema format needs its schema
        errs = errors_of(S.ChatCompletionRequest, {**CHAT, "response_format": bad})
        assert errs[0]["loc"][0] == "response_format"


def test_n_predict_is_max_tokens():
    """llama-server's name: used when max_tokens is absent; -1 means until EOS or the end of the slot (None)."""
    assert S.CompletionRequest.model_validate({"prompt": "x", "n_predict": 5}).max_tokens == 5
    assert S.CompletionRequest.model_validate({"prompt": "x", "n_predict": 5, "max_tokens": 7}).max_tokens == 7
    assert S.CompletionRequest.model_validate({"prompt": "x", "n_predict": -1}).max_tokens is None
    assert S.CompletionRequest.model_validate({"prompt": "x"}).max_tokens == S.COMPLETION_MAX_TOKENS_DEFAULT
    assert S.ChatCompletionRequest.model_validate({**CHAT, "n_predict": 5}).max_tokens == 5
    assert S.ChatCompletionRequest.model_validate({**CHAT, "n_predict": 5, "max_completion_tokens": 3}).max_tokens == 3
    for bad in (0, -2, "5"):
        assert errors_of(S.CompletionRequest, {"prompt": "x", "n_predict": bad})[0]["loc"][0] == "n_predict"


def test_top_logprobs_only_with_logprobs():
    assert S.ChatCompletionRequest.model_validate({**CHAT, "top_logprobs": 2}).top_logprobs is None
    req = S.ChatCompletionRequest.model_validate({**CHAT, "logprobs": True, "top_logprobs": 2})
    assert req.logprobs and req.top_logprobs == 2


LONE = '"\\ud800"'  # a JSON string holding a lone surrogate; json.loads accepts it


@pytest.mark.parametrize("body", [
    '{"prompt": %s}' % LONE,
    '{"prompt": ["ok", %s]}' % LONE,
    '{"prompt": "x", "stop": %s}' % LONE,
    '{"prompt": "x", "stop": ["ok", %s]}' % LONE,
    '{"prompt": "x", "model": %s}' % LONE,
])
def test_lone_surrogate_rejected_in_completions(body):
    errs = errors_of(S.CompletionRequest, parse_json(body))
    assert "not valid Unicode" in errs[0]["msg"]


@pytest.mark.parametrize("body", [
    '{"messages": [{"role": "user", "content": %s}]}' % LONE,
    '{"messages": [{"role": "user", "content": [{"type": "text", "text": %s}]}]}' % LONE,
    '{"messages": [{"role": "user", "content": "x", "name": %s}]}' % LONE,
    '{"messages": [{"role": "user", "content": "x"}], "stop": [%s]}' % LONE,
])
def test_lone_surrogate_rejected_in_chat(body):
    assert "not valid Unicode" in messages_of(S.ChatCompletionRequest, parse_json(body))


def test_lone_surrogate_rejected_in_tokenize():
    assert "not valid Unicode" in messages_of(S.TokenizeRequest, parse_json('{"content": %s}' % LONE))


def test_valid_non_ascii_accepted():
    req = S.CompletionRequest.model_validate(parse_json('{"prompt": "caf\\u00e9 \\ud83d\\ude00"}'))
    assert req.prompt == "café 😀"


@pytest.mark.parametrize("prompt", ["", [], [""], [[]], [[1], []], [1, -1], [[-1]], [1, "a"], [1.5], [True],
                                    None, 5, {"a": 1}])
def test_bad_prompts_rejected(prompt):
    errs = errors_of(S.CompletionRequest, {"prompt": prompt})
    assert errs[0]["loc"] == ("prompt",)
    assert len(errs) == 1  # one clear error, not one per member of the union


def test_negative_token_message_names_the_position():
    assert messages_of(S.CompletionRequest, {"prompt": [[5, 6], [7, -1]]}) == \
        "token ids must be >= 0 (got -1 at prompt[1][1])"


def test_detokenize_rejects_negative_ids():
    errors_of(S.DetokenizeRequest, {"tokens": [1, -1]})
    assert S.DetokenizeRequest.model_validate({"tokens": []}).tokens == []


# --- what clients send ---------------------------------------------------------------------------------------------


def test_defaults_filled_in():
    req = S.CompletionRequest.model_validate({"prompt": "x", "temperature": None, "max_tokens": None,
                                              "top_p": None, "stop": None, "stream": None})
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k) == (16, 1.0, 1.0, 0)
    assert req.stop == [] and req.stream is False and req.echo is False and req.cache_prompt is True
    assert req.speculative.enabled and req.speculative.n_max is None
    assert not req.include_usage


def test_lm_eval_loglikelihood_request():
    # lm-eval local-completions: batched token-id prompts, logprobs + echo, seed.
    body = {"model": "gemma", "prompt": [[2, 651, 6037], [2, 651]], "temperature": 0, "max_tokens": 1,
            "logprobs": 5, "seed": 1234, "echo": True}
    req = S.CompletionRequest.model_validate(body)
    assert req.prompts() == [[2, 651, 6037], [2, 651]]
    assert (req.logprobs, req.echo, req.seed, req.temperature) == (5, True, 1234, 0)


def test_lm_eval_generate_request():
    body = {"model": "gemma", "prompt": [[2, 10, 11]], "max_tokens": 256, "temperature": 0,
            "stop": ["\nclass", "\ndef", "\n#", "\nif", "\nprint"], "seed": 1234, "do_sample": False}
    req = S.CompletionRequest.model_validate(body)
    assert len(req.stop) == 5 and req.prompts() == [[2, 10, 11]]


@pytest.mark.parametrize("prompt,expected", [("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]),
                                             ([[1], [2, 3]], [[1], [2, 3]])])
def test_prompt_forms(prompt, expected):
    assert S.CompletionRequest.model_validate({"prompt": prompt}).prompts() == expected


def test_integral_floats_are_integers():
    # JSON Schema counts 5.0 as an integer (schemathesis sends it); strings and booleans are still refused.
    req = S.CompletionRequest.model_validate({"prompt": [[1.0, 2], [3.0]], "max_tokens": 5.0, "logprobs": 2.0})
    assert req.prompt == [[1, 2], [3]] and req.max_tokens == 5 and req.logprobs == 2
    assert all(type(t) is int for t in req.prompt[0])
    errors_of(S.CompletionRequest, {"prompt": [1.5]})


def test_stop_normalised_to_a_list():
    assert S.CompletionRequest.model_validate({"prompt": "x", "stop": "\n"}).stop == ["\n"]
    assert S.CompletionRequest.model_validate({"prompt": "x", "stop": ["a", ""]}).stop == ["a"]
    assert errors_of(S.CompletionRequest, {"prompt": "x", "stop": ["a"] * (S.MAX_STOP + 1)})


def test_openai_client_chat_request():
    body = {"model": "any", "messages": [{"role": "developer", "content": "be short"},
                                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]},
                                         {"role": "assistant", "content": None},
                                         {"role": "user", "content": "c", "name": "bob"}],
            "max_completion_tokens": 20, "max_tokens": 99, "stream": True,
            "stream_options": {"include_usage": True}, "seed": 7, "n": 1, "logprobs": False,
            "speculative": {"enabled": False, "n_max": 4}, "tools": [], "logit_bias": {}}
    req = S.ChatCompletionRequest.model_validate(body)
    assert req.max_tokens == 20  # max_completion_tokens wins
    assert req.include_usage and req.stream
    assert req.speculative.enabled is False and req.speculative.n_max == 4
    assert req.template_messages() == [{"role": "developer", "content": "be short"},
                                       {"role": "user", "content": "a\nb"},
                                       {"role": "assistant", "content": ""},
                                       {"role": "user", "content": "c", "name": "bob"}]


def test_chat_max_tokens_none_means_until_context_end():
    assert S.ChatCompletionRequest.model_validate(CHAT).max_tokens is None


def test_tokenize_defaults():
    req = S.TokenizeRequest.model_validate({"content": "hi"})
    assert req.add_special is False and req.parse_special is True and req.model is None


# --- responses -----------------------------------------------------------------------------------------------------


def test_timings_rates_and_zero_time():
    t = S.Timings.of(prompt_n=100, prompt_ms=50.0, predicted_n=10, predicted_ms=0.0, draft_n=8, draft_n_accepted=5)
    assert t.prompt_per_second == 2000.0 and t.predicted_per_second == 0.0
    assert json.loads(t.model_dump_json())["draft_n_accepted"] == 5


def test_usage_totals_and_cached():
    u = S.Usage.of(prompt=7, completion=3, cached=4)
    assert u.model_dump() == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                              "prompt_tokens_details": {"cached_tokens": 4}}


def test_non_finite_logprobs_serialise_as_json():
    lp = S.CompletionLogprobs(tokens=["a", "b"], token_logprobs=[None, -math.inf],
                              top_logprobs=[None, {"b": float("nan")}], text_offset=[0, 1])
    data = json.loads(lp.model_dump_json())
    assert data["token_logprobs"] == [None, -9999.0] and data["top_logprobs"][1] == {"b": -9999.0}
    json.dumps(lp.model_dump(), allow_nan=False)  # what Starlette's JSONResponse does


def test_response_shapes():
    r = S.ChatCompletionResponse(id="chatcmpl-1", model="m", usage=S.Usage.of(1, 1),
                                 choices=[S.ChatChoice(index=0, message=S.ChatMessageOut(content="hi"),
                                                       finish_reason="stop")])
    d = r.model_dump()
    assert d["object"] == "chat.completion"
    assert d["choices"][0]["message"] == {"role": "assistant", "content": "hi", "tool_calls": None}
    chunk = S.ChatChunk(id="chatcmpl-1", model="m", choices=[], usage=S.Usage.of(1, 1))
    assert chunk.model_dump()["object"] == "chat.completion.chunk"
    c = S.CompletionChunk(id="cmpl-1", model="m", choices=[S.CompletionChoice(index=0, text="x")])
    assert c.model_dump()["choices"][0]["finish_reason"] is None
    models = S.ModelList(data=[S.ModelCard(id="gemma", meta=S.ModelMeta(resident=True))]).model_dump()
    assert models["object"] == "list" and models["data"][0]["owned_by"] == "pydflash"
    with pytest.raises(ValidationError):
        S.CompletionChoice(index=0, text="x", finish_reason="eos")


def test_openapi_schema_generates():
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/completions", response_model=S.CompletionResponse)
    def completions(req: S.CompletionRequest):
        pass

    @app.post("/v1/chat/completions", response_model=S.ChatCompletionResponse)
    def chat(req: S.ChatCompletionRequest):
        pass

    @app.post("/tokenize", response_model=S.TokenizeResponse)
    def tokenize(req: S.TokenizeRequest):
        pass

    @app.get("/v1/models", response_model=S.ModelList)
    def models():
        pass

    schema = app.openapi()
    comp = schema["components"]["schemas"]
    # Constraints are in the schema, so schemathesis generates (and expects refusals) as the server validates.
    # a refused field: its neutral values
    assert comp["CompletionRequest"]["properties"]["suffix"]["enum"] == ["", None]
    assert comp["CompletionRequest"]["required"] == ["prompt"]
    assert "discriminator" in json.dumps(comp["ChatCompletionRequest"]["properties"]["messages"])
    # Only standard JSON-schema keywords: pydantic emits "ge"/"le" verbatim when a bound cannot reach the type.
    text = json.dumps(schema)
    # ("strict" as a property, OpenAI's function field, is a name followed by its schema object)
    assert not re.search(r'"(ge|le|gt|lt|strict)": [^{]', text)

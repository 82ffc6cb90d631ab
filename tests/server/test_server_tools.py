"""Tool calling through a real uvicorn and the real ``openai`` client (server/tools.py): a forced call (``required``
or a named function) is grammar-constrained, so even a random tiny model and the Gemma-3-270M base model emit a
call whose name is among the tools and whose arguments validate; streamed calls reassemble from OpenAI's deltas;
an agent's second turn (the call, then a ``tool`` message) is served; the reader splits text and calls the same
way whether the text comes whole or a character at a time."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.helpers.server_util import Server, write_models_toml

from pydflash.server import chat, tools

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 16}}, "required": ["timezone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    cfg = write_models_toml(tmp_path_factory.mktemp("tools") / "models.toml", {
        "tiny": {"target": str(pair.target), "drafter": str(pair.drafter), "n_slots": 2, "n_ctx_slot": 1024}})
    srv = Server(["--config", str(cfg)])
    yield srv
    srv.stop()


def check_calls(message, names=("get_weather", "get_time")):
    assert message.tool_calls, message
    for c in message.tool_calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return message.tool_calls


def forced(client, model="tiny", **kw):
    kw = {"temperature": 0, "max_tokens": 200, **kw}
    return client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, **kw)


def test_required_gives_one_valid_call(server):
    out = forced(server.openai(), tool_choice="required", parallel_tool_calls=False)
    assert out.choices[0].finish_reason == "tool_calls"
    assert len(check_calls(out.choices[0].message)) == 1


def test_a_named_function_is_the_one_called(server):
    out = forced(server.openai(), tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = check_calls(out.choices[0].message, names=("get_time",))
    assert out.choices[0].finish_reason == "tool_calls"


def test_required_at_temperature_keeps_calls_valid(server):
    for seed in range(3):  # sampled, with speculation: rejection sampling under the grammar's mask
        out = forced(server.openai(), tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        check_calls(out.choices[0].message)


def test_streamed_call_reassembles_as_the_whole_one(server):
    client = server.openai()
    whole = forced(client, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls
    stream = forced(client, tool_choice="required", parallel_tool_calls=False, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert c["id"] is None and c["arguments"] == "", "id and name come first, once"
                    c["id"], c["name"] = d.id, d.function.name
                c["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_an_agent_turn_after_the_tool_result(server):
    client = server.openai()
    first = forced(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    msg = first.choices[0].message
    [call] = check_calls(msg)
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, temperature=0,
                                            max_tokens=8, tool_choice="none")
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.tool_calls is None
    # the call and its result reached the prompt (with "none" the tool list is left out of both)
    alone = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=1,
                                           tool_choice="none")
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_auto_is_served_unconstrained(server):
    out = server.openai().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, temperature=0,
                                                  max_tokens=8)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls


@pytest.mark.parametrize("choice, why", [
    ({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    ("required", "needs tools"),
])
def test_a_bad_tool_choice_is_a_400(server, choice, why):
    kw = {"tools": TOOLS} if why != "needs tools" else {}
    with pytest.raises(openai.BadRequestError) as info:
        server.openai().chat.completions.create(model="tiny", messages=ASK, tool_choice=choice, max_tokens=4, **kw)
    assert info.value.param == "tool_choice" and why in info.value.message


# --- the reader, without a server ----------------------------------------------------------------------------------

def _plan(arch="gemma3", parallel=True):
    return tools.plan(TOOLS, "auto", parallel, chat.resolve(None, arch, None))


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_the_reader_splits_the_same_whole_or_streamed(arch):
    tp = _plan(arch)
    call = tools.write_call("get_weather", {"city": "Lima", "unit": "celsius"}, tp.fmt)
    bogus = tools.write_call("unknown_tool", {}, tp.fmt)
    text = f"Let me check. {call}\n{bogus} done"
    content, calls = tools.split(text, tp)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Lima", "unit": "celsius"})]
    assert content == "Let me check." + bogus + "done"  # a block naming no tool stays text
    reader = tools.CallReader(tp)
    parts = [p for ch in text for p in reader.feed(ch)] + reader.finish()
    assert "".join(p for p in parts if isinstance(p, str)) == content
    assert [c.name for c in parts if isinstance(c, tools.ToolCall)] == ["get_weather"]


def test_without_parallel_calls_the_first_call_is_kept():
    tp = _plan(parallel=False)
    two = tools.write_call("get_time", {"timezone": "UTC"}, tp.fmt) + tools.write_call("get_weather", {}, tp.fmt)
    _, calls = tools.split(two, tp)
    assert [c.name for c in calls] == ["get_time"]


def test_a_call_cut_short_stays_text():
    tp = _plan()
    text = tools.write_call("get_time", {"timezone": "UTC"}, tp.fmt)[:-12]
    content, calls = tools.split(text, tp)
    assert calls == [] and content == text


@pytest.mark.real_model
def test_default_pair_forced_call_matches_its_schema():
    srv = Server(["-np", "1", "-c", "2048"], ready_timeout=300)
    try:
        client = srv.openai(timeout=300)
        out = forced(client, model="any", tool_choice="required", parallel_tool_calls=False)
        assert out.choices[0].finish_reason == "tool_calls"
        check_calls(out.choices[0].message)
        named = forced(client, model="any", tool_choice={"type": "function", "function": {"name": "get_time"}})
        check_calls(named.choices[0].message, names=("get_time",))
        assert named.model_extra["timings"]["draft_n"] > 0  # speculation stayed on
    finally:
        srv.stop()

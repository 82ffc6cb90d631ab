"""Tool calling in chat: how tools reach the prompt, the grammar that forces a call, and how calls are read back.

A call is written as one JSON object ``{"name": ..., "arguments": {...}}`` between two markers (``CallFormat``):
- ``HERMES``: ``<tool_call>\\n{...}\\n</tool_call>``, the Hermes/Qwen format, for ChatML targets and every
  template that speaks it;
- ``FENCED``: a fenced block, ```` ```tool_call\\n{...}\\n``` ````, for Gemma, which has no tool format of its own
  (llama.cpp's generic handler does the same in spirit: a system-prompt tool list and a JSON call).

Rendering (``render``): a template that supports tools natively (its source uses ``tools`` and ``<tool_call>``,
as Qwen2.5/Qwen3/Hermes templates do) gets ``tools`` and the messages as they are (assistant ``tool_calls``,
``tool`` messages). Any other template gets plain messages: the tool list and the call format open the system
text, an earlier call is written in the format as the assistant's text, a tool result becomes a user turn
(``<tool_response>`` or a ```` ```tool_result ```` fence; adjacent results and a user message after them share one
turn, so Gemma's strict alternation holds).

``tool_choice``:
- ``auto`` (the default with tools): the model answers in text or calls; what it wrote is parsed, unconstrained;
- ``none``: the tool list is left out of the prompt and nothing is parsed;
- ``required`` / a named function: the output is constrained by a GBNF (``grammar``) built from the tools' JSON
  schemas: the call's name is one of the tools (or the named one) and its arguments follow that tool's schema.
``parallel_tool_calls: false`` allows one call (the grammar, and the parser keeps the first).

Reading back (``CallReader``): text outside call blocks is content (whitespace next to a call dropped); a block
whose JSON parses and names one of the tools is a call, any other block stays content. Streaming feeds the reader
as text arrives: content goes out as soon as it cannot be the start of a marker, a call once its block is closed
(or the output ended), as OpenAI's deltas: ``{index, id, type, function: {name, arguments: ""}}`` then the
arguments.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Optional

from ..engine.schema import to_gbnf
from ..errors import InvalidRequest
from .chat import ChatTemplate
from .errors import InvalidRequestError

MAX_PARALLEL = 8  # calls one constrained answer may hold: a base model under a grammar may otherwise never stop


@dataclass(frozen=True)
class CallFormat:
    name: str
    open: str  # the markers as the model writes them (matched exactly; the newlines around the JSON are free)
    close: str
    result_open: str  # how a tool's result is shown to the model (injected formats only)
    result_close: str


HERMES = CallFormat("hermes", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
FENCED = CallFormat("fenced", "```tool_call", "```", "```tool_result", "```")


@dataclass(frozen=True)
class ToolPlan:
    """What one chat request asks of tools."""

    tools: list[dict]  # OpenAI tool objects: {"type": "function", "function": {name, description, parameters}}
    choice: str  # "auto", "none", "required" or the name of the function that must be called
    parallel: bool
    fmt: CallFormat
    native: bool  # the model's own template renders the tools

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def parses(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return bool(self.tools) and self.choice not in ("auto", "none")


def native_format(template: ChatTemplate) -> bool:
    return "tools" in template.source and HERMES.open in template.source


def plan(tools: Optional[list[dict]], tool_choice, parallel: Optional[bool], template: ChatTemplate) -> ToolPlan:
    """The request's tools as a ``ToolPlan``; a choice that names no given tool, or ``required`` without tools,
    is the client's error."""
    tools = tools or []
    if tool_choice is None:
        choice = "auto"
    elif isinstance(tool_choice, str):
        choice = tool_choice
    else:
        choice = tool_choice["function"]["name"]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools: function names must be unique", param="tools")
    if choice not in ("auto", "none") and not tools:
        raise InvalidRequestError(f"tool_choice {choice!r} needs tools", param="tool_choice")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise InvalidRequestError(f"tool_choice names {choice!r}, which is not among the tools", param="tool_choice")
    native = native_format(template)
    fmt = HERMES if native or "<start_of_turn>" not in template.source else FENCED
    return ToolPlan(tools, choice, parallel is not False, fmt, native)


# --- rendering -----------------------------------------------------------------------------------------------------


def render(template: ChatTemplate, messages: list[dict], tp: ToolPlan) -> str:
    """The prompt of a conversation that may hold tools, calls and results (module docstring)."""
    offered = tp.tools if tp.choice != "none" else []
    if tp.native:
        native = [_native_message(m) for m in messages]
        return template.render(native, add_generation_prompt=True, tools=offered or None)
    return template.render(_inject(messages, offered, tp.fmt), add_generation_prompt=True)


def _native_message(m: dict) -> dict:
    # HF templates (Qwen's: tool_call.arguments | tojson) expect the arguments as an object, not OpenAI's string
    if not m.get("tool_calls"):
        return m
    calls = [{**c, "function": {**c["function"], "arguments": _arguments_object(c["function"]["arguments"])}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls}


def _arguments_object(arguments: str):
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def instructions(tools: list[dict], fmt: CallFormat) -> str:
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    example = write_call("function_name", "{\"argument\": \"value\"}", fmt)
    return (f"You can call these tools (each a function with a JSON schema of its arguments):\n{listed}\n\n"
            f"To call a tool, answer with one block per call, exactly:\n{example}\n"
            f"Otherwise answer in plain text.")


def write_call(name: str, arguments: str, fmt: CallFormat) -> str:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{fmt.open}\n{{\"name\": {json.dumps(name, ensure_ascii=False)}, \"arguments\": {args}}}\n{fmt.close}"


def _inject(messages: list[dict], offered: list[dict], fmt: CallFormat) -> list[dict]:
    out: list[dict] = []
    if offered:
        text = instructions(offered, fmt)
        if messages and messages[0]["role"] in ("system", "developer"):
            out.append({"role": messages[0]["role"], "content": text + "\n\n" + messages[0]["content"]})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": text})
    after_result = False  # the last turn out is a user turn made of tool results
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            result = f"{fmt.result_open}\n{content}\n{fmt.result_close}"
            if after_result:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result})
            after_result = True
            continue
        if role == "user" and after_result:
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + content}
            after_result = False
            continue
        after_result = False
        if role == "assistant" and m.get("tool_calls"):
            calls = [write_call(c["function"]["name"], c["function"]["arguments"], fmt) for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")} | {"content": content})
    return out


# --- the grammar of a forced call ----------------------------------------------------------------------------------


def grammar(tp: ToolPlan) -> Optional[str]:
    """GBNF for ``required`` / a named function: one call block (up to MAX_PARALLEL with parallel calls) whose JSON
    names a tool and holds arguments valid under its schema. None when nothing is forced."""
    if not tp.forced:
        return None
    chosen = [t["function"] for t in tp.tools if tp.choice == "required" or t["function"]["name"] == tp.choice]
    alternatives = [{"type": "object", "properties": {
        "name": {"const": f["name"]},
        "arguments": f.get("parameters") or {"type": "object"}}, "required": ["name", "arguments"]}
        for f in chosen]
    schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    try:
        body = to_gbnf(schema)
    except InvalidRequest as exc:
        raise InvalidRequestError(f"tools: a function's parameters cannot be turned into a grammar: {exc}",
                             param="tools") from None
    # the converter's root becomes the call; the new root wraps it in the format's markers
    rules = [("tool-call ::=" + line[len("root ::="):]) if line.startswith("root ::=") else line
             for line in body.split("\n")]
    block = f"{_lit(tp.fmt.open + chr(10))} tool-call {_lit(chr(10) + tp.fmt.close)}"
    more = f' ("\\n" {block}){{0,{MAX_PARALLEL - 1}}}' if tp.parallel and tp.choice == "required" else ""
    return f"root ::= {block}{more}\n" + "\n".join(rules)


def _lit(text: str) -> str:
    return json.dumps(text)  # a GBNF literal takes JSON's escapes (\n, \", \\)


# --- reading calls back --------------------------------------------------------------------------------------------


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it

    def message(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class CallReader:
    """Splits generated text into content and tool calls as it arrives (``feed``), then at the end (``finish``).
    Each returns what is now known: content text and completed calls, in order."""

    tp: ToolPlan
    calls: list[ToolCall] = field(default_factory=list)
    _buf: str = ""
    _inside: bool = False
    _after_call: bool = False  # whitespace that follows a call block is dropped

    def feed(self, text: str) -> list:
        self._buf += text
        out: list = []
        while True:
            fmt = self.tp.fmt
            if not self._inside:
                if self._after_call:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        return out
                    self._after_call = False
                i = self._buf.find(fmt.open)
                if i < 0:
                    # hold back what may begin a marker, and trailing whitespace (dropped if a call follows)
                    keep = _partial_suffix(self._buf, fmt.open)
                    head = self._buf[:len(self._buf) - keep]
                    cut = len(head.rstrip())
                    self._emit(out, self._buf[:cut])
                    self._buf = self._buf[cut:]
                    return out
                self._emit(out, self._buf[:i].rstrip())
                self._buf, self._inside = self._buf[i + len(fmt.open):], True
            j = self._buf.find(fmt.close)
            if j < 0:
                return out
            block, self._buf, self._inside = self._buf[:j], self._buf[j + len(fmt.close):], False
            self._after_call = True
            self._block(out, block)

    def finish(self) -> list:
        out: list = []
        if self._inside:  # cut by max_tokens or a stop string: a call only if its JSON is whole
            self._block(out, self._buf, closed=False)
        else:
            self._emit(out, self._buf.rstrip())
        self._buf, self._inside = "", False
        return out

    def _emit(self, out: list, text: str) -> None:
        if text:
            out.append(text)

    def _block(self, out: list, block: str, closed: bool = True) -> None:
        call = self._call(block)
        if call is None:
            fmt = self.tp.fmt
            self._emit(out, fmt.open + block + (fmt.close if closed else ""))
        elif self.tp.parallel or not self.calls:  # without parallel calls, a second call is dropped
            self.calls.append(call)
            out.append(call)

    def _call(self, block: str) -> Optional[ToolCall]:
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.tp.names:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI sends them
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall("call_" + uuid.uuid4().hex[:24], obj["name"], json.dumps(args, ensure_ascii=False))


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def split(text: str, tp: ToolPlan) -> tuple[Optional[str], list[ToolCall]]:
    """A whole answer as (content or None, calls)."""
    reader = CallReader(tp)
    parts = reader.feed(text) + reader.finish()
    content = "".join(p for p in parts if isinstance(p, str))
    return (content or None), reader.calls

"""A body's sampling controls as the engine ``Request`` takes them, and the engine's refusals as 400s that name the
client's field.

- ``logit_bias``: OpenAI's ``{"<id>": bias}`` or llama-server's ``[[id or text, bias], ...]`` (and text keys in the
  object form) -> ``{id: bias}``. Text is tokenized without BOS and every one of its tokens gets the bias, as
  llama-server does; ``false`` is a ban (-100, which the engine stores as -inf).
- ``response_format``: ``json_schema`` -> its schema (always enforced: ``strict`` changes nothing), ``json_object``
  -> ``{"type": "object"}`` (or llama-server's ``schema`` next to it), ``text`` -> nothing.
- Penalties, ``min_p``, ``grammar`` and ``json_schema`` pass as they are; a null is the engine's default.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ..errors import ContextOverflow, InvalidRequest
from . import schemas as S
from .errors import InvalidRequestError
from .tokenizer import Tokenizer

BAN = -100.0
ANY_OBJECT = {"type": "object"}
_FIELD = re.compile(r"[a-z_]+")


async def engine_kwargs(body: S._Generation, tokenizer: Tokenizer, tool_grammar: Optional[str]) -> dict[str, Any]:
    """The Request keyword arguments of ``body``'s controls; ``tool_grammar``: a forced tool call's (tools.py)."""
    fmt_schema = response_schema(body.response_format)
    grammar = body.grammar or None  # llama-server sends "" for none
    if fmt_schema is not None and (grammar is not None or body.json_schema is not None):
        raise InvalidRequestError("response_format json_object / json_schema cannot be combined with grammar or "
                                  "json_schema: give one", param="response_format")
    if tool_grammar is not None:
        if grammar is not None or body.json_schema is not None or fmt_schema is not None:
            raise InvalidRequestError("a forced tool call (tool_choice required or a named function) is already "
                                      "constrained: it cannot be combined with grammar, json_schema or "
                                      "response_format", param="tool_choice")
        grammar = tool_grammar
    kw: dict[str, Any] = dict(
        logit_bias=await logit_bias(body.logit_bias, tokenizer), grammar=grammar,
        json_schema=fmt_schema if fmt_schema is not None else body.json_schema)
    for name in ("min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n"):
        if getattr(body, name) is not None:
            kw[name] = getattr(body, name)
    return kw


def response_schema(fmt) -> Optional[dict]:
    if isinstance(fmt, S.ResponseFormatJSONSchema):
        return fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else ANY_OBJECT
    if isinstance(fmt, S.ResponseFormatJSONObject):
        return fmt.schema_ if fmt.schema_ is not None else ANY_OBJECT
    return None


async def logit_bias(raw, tokenizer: Tokenizer) -> Optional[dict[int, float]]:
    if not raw:
        return None
    pairs = raw.items() if isinstance(raw, dict) else raw
    out: dict[int, float] = {}
    for key, bias in pairs:
        bias = BAN if bias is False else float(bias)
        if isinstance(key, int):
            ids = [key]
        elif key.isascii() and key.isdigit():  # OpenAI's object form: ids as decimal strings
            ids = [int(key)]
        else:  # llama-server: a piece of text, every token of it
            ids = await tokenizer.tokenize(key, False)
        for t in ids:
            out[t] = bias
    return out or None


def field_error(exc: BaseException, body: S._Generation) -> BaseException:
    """An engine ``InvalidRequest`` as a 400 whose ``param`` is the field the client sent. The engine's messages
    about a field start with its name (``"min_p must be ..."``, ``"logit_bias[5]: ..."``); the schema already checked
    every type and range, so these are what only the engine can tell (token ids past the vocabulary, a grammar
    llama.cpp cannot parse, a schema it cannot convert, fields that exclude each other)."""
    if not isinstance(exc, InvalidRequest) or isinstance(exc, ContextOverflow):
        return exc
    head = _FIELD.match(str(exc))
    name = head.group(0) if head else None
    if name == "json_schema" and body.json_schema is None:
        name = "response_format"
    elif name == "grammar" and not body.grammar:
        name = "tool_choice"
    if name not in type(body).model_fields:
        return exc
    return InvalidRequestError(str(exc), param=name)

"""A JSON schema as a GBNF grammar, through llama-cpp-python's converter (``llama_cpp.llama_grammar``, a Python
port of llama.cpp's ``json_schema_to_grammar``; pure Python, no native call).

Supported: what that converter supports (types, properties / required / additionalProperties, items / prefixItems
/ minItems / maxItems, enum / const, anyOf / oneOf / allOf, local ``$ref``s to ``#/$defs`` or ``#/definitions``,
string formats and patterns, min/max lengths), which covers OpenAI's strict-mode subset. Anything it refuses
(an unknown type, ``not``, a remote ``$ref``, a schema that is not an object) is an ``InvalidRequest`` naming
``json_schema``. As in llama.cpp, properties come out in the schema's order and optional ones may be left out.

One fix on the converter's output: its string character rule (``[^"\\]``) admits raw control characters, which
JSON forbids inside strings (a model writing a tab would produce text no JSON parser reads); llama.cpp's own
converter excludes them, and so does the rule here.
"""

from __future__ import annotations

import json
from typing import Mapping, Union

from .. import native  # noqa: F401  llama_cpp (imported below) must find our libllama: native/_lib sets it up
from ..errors import InvalidRequest


def to_gbnf(schema: Union[Mapping, str]) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"json_schema: not valid JSON ({exc})") from None
    if not isinstance(schema, Mapping):
        raise InvalidRequest(f"json_schema must be a JSON object (a schema), got {type(schema).__name__}")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return _strict_strings(json_schema_to_gbnf(json.dumps(schema)))
    except (AssertionError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        # the converter states what it cannot convert with bare asserts and lookups
        raise InvalidRequest(f"json_schema: not supported ({exc or type(exc).__name__})") from None


_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def _strict_strings(gbnf: str) -> str:
    return "\n".join(_STRICT_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in gbnf.split("\n"))

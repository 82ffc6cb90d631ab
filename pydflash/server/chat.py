"""Chat templates: a conversation -> one prompt string, rendered with Jinja2 as Hugging Face and llama.cpp do.

Which template (``resolve``), first match wins:
1. ``--chat-template`` / the preset's ``chat_template``: a built-in NAME (``gemma``, ``chatml``) or a FILE path.
2. The GGUF's ``tokenizer.chat_template``.
3. By architecture: ``gemma*`` -> ``gemma``; anything else -> ``chatml``. The default Gemma-3-270M GGUF is a base
   model with no template, so it lands here.

Rendering runs in Jinja2's immutable sandbox with HF's extras (``raise_exception``, ``strftime_now``, ``tojson``,
``bos_token``, ``eos_token``, ``add_generation_prompt``). An error raised by the template (``raise_exception("roles
must alternate")``) is the client's problem: ``InvalidRequest`` (400) with the template's message.

The ``developer`` role (OpenAI's newer name for ``system``) is passed through when the template's source mentions
``developer``, and renamed to ``system`` otherwise.

BOS: a template may write the BOS text itself (Gemma's does). Tokenize the rendered prompt with
``add_special=not template.emits_bos`` (and ``parse_special=True``, so ``<start_of_turn>`` is one token), or the
prompt starts with two BOS tokens.
"""

from __future__ import annotations

import json
import logging
import pathlib
from datetime import datetime
from typing import Optional

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pydflash.errors import InvalidRequest, PydflashError

log = logging.getLogger(__name__)


class ChatTemplateError(PydflashError, ValueError):
    """A chat template could not be found or compiled (a configuration error, found at startup)."""


# Gemma's turn format: <start_of_turn>{user|model}\n{text}<end_of_turn>\n. Gemma has no system turn: system text
# (all leading system messages, developer mapped to system) opens the first user turn, followed by a blank line.
GEMMA = """\
{{- bos_token -}}
{%- set ns = namespace(prefix="", expect="user", seen_turn=false) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- if ns.seen_turn -%}
      {{- raise_exception("System messages are only supported at the beginning of the conversation") -}}
    {%- endif -%}
    {%- set ns.prefix = ns.prefix + (message['content'] | trim) + "\n\n" -%}
  {%- else -%}
    {%- if message['role'] != ns.expect -%}
      {{- raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") -}}
    {%- endif -%}
    {%- set ns.seen_turn = true -%}
    {%- if message['role'] == 'user' -%}
<start_of_turn>user
{{ ns.prefix }}{{ message['content'] | trim }}<end_of_turn>
{% set ns.prefix = "" -%}
      {%- set ns.expect = "assistant" -%}
    {%- else -%}
<start_of_turn>model
{{ message['content'] | trim }}<end_of_turn>
{% set ns.expect = "user" -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.prefix -%}
<start_of_turn>user
{{ ns.prefix | trim }}<end_of_turn>
{% endif -%}
{%- if add_generation_prompt -%}
<start_of_turn>model
{% endif -%}
"""

# ChatML: <|im_start|>{role}\n{text}<|im_end|>\n per message, any roles, any order.
CHATML = """\
{%- for message in messages -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

BUILTIN = {"gemma": GEMMA, "chatml": CHATML}


def _raise_exception(message):
    raise TemplateError(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    # HF's tojson: keeps non-ASCII text as is (Jinja's built-in escapes it for HTML).
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. ``name`` says where it came from (for logs and errors)."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.has_developer_role = "developer" in source
        try:
            self._template = _environment().from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template {name!r} does not compile: {exc}") from exc
        self._emits_bos: Optional[bool] = None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: Optional[list] = None) -> str:
        """``messages``: ``[{"role": str, "content": str}, ...]`` (see ``ChatCompletionRequest.template_messages``);
        ``tools``: OpenAI tool objects, for a template that renders them itself (``tools.py``)."""
        if not self.has_developer_role:
            messages = [dict(m, role="system") if m.get("role") == "developer" else m for m in messages]
        extra = {"tools": tools} if tools else {}
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except TemplateError as exc:
            raise InvalidRequest(f"chat template {self.name}: {exc}") from exc
        except Exception as exc:  # a template that breaks on this conversation: still about the input, not a 500
            log.warning("chat template %s failed: %r", self.name, exc)
            raise InvalidRequest(f"chat template {self.name} cannot render this conversation: {exc}") from exc

    @property
    def emits_bos(self) -> bool:
        """True when the template writes the BOS text itself, so the tokenizer must not add another."""
        if self._emits_bos is None:
            self._emits_bos = bool(self.bos_token) and self._probe().startswith(self.bos_token)
        return self._emits_bos

    def _probe(self) -> str:
        try:
            return self.render([{"role": "user", "content": "hi"}])
        except InvalidRequest:  # a template that refuses a lone user turn: judge by how its source starts
            head = self.source.lstrip().removeprefix("{{").lstrip("-").lstrip()
            return self.bos_token if head.startswith("bos_token") else ""

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r})"


def resolve(gguf_template: Optional[str], architecture: str, override: Optional[str],
            bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """The chat template of one model: the override, else the GGUF's, else the architecture's (module docstring)."""
    tokens = dict(bos_token=bos_token, eos_token=eos_token)
    if override:
        template = _from_override(override, tokens)
        log.info("chat template: %s (from --chat-template / the preset)", template.name)
        return template
    if gguf_template:
        try:
            template = ChatTemplate(gguf_template, "gguf:tokenizer.chat_template", **tokens)
            log.info("chat template: the GGUF's tokenizer.chat_template")
            return template
        except ChatTemplateError as exc:
            log.warning("%s; falling back to the architecture's template", exc)
    name = "gemma" if (architecture or "").lower().startswith("gemma") else "chatml"
    log.info("chat template: built-in %r (the GGUF has no usable template; architecture %r)", name, architecture)
    return ChatTemplate(BUILTIN[name], name, **tokens)


def _from_override(override: str, tokens: dict) -> ChatTemplate:
    if override in BUILTIN:
        return ChatTemplate(BUILTIN[override], override, **tokens)
    path = pathlib.Path(override).expanduser()
    if path.is_file():
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"cannot read chat template file {str(path)!r}: {exc}") from exc
        return ChatTemplate(source, str(path), **tokens)
    if "/" not in override and "\\" not in override and not path.suffix:
        raise ChatTemplateError(
            f"unknown chat template {override!r}: use a built-in name ({', '.join(BUILTIN)}) or a file path")
    raise ChatTemplateError(f"chat template file not found: {str(path)!r}")

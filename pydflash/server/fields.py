"""What the server does with each request field it knows: a field that changes the output is applied or refused,
never accepted and ignored.

- ``APPLIED``: fields the handlers pass on to the engine (or act on), with what they mean here.
- ``REFUSED``: fields that would change the output and are not applied. Each is accepted only at a neutral value,
  one that changes nothing (``mirostat: 0``, ``suffix: ""``, ``functions: []``; null always), so that clients
  which send their defaults keep working; any other value is a 400 whose ``param`` names the field. The published
  JSON schema says the same (``schemas.py`` declares each refused field with its neutral values as an enum).
- ``NO_EFFECT``: fields accepted whatever they hold, because they change nothing in the output.

Fields named nowhere here are dropped by the schemas (``extra="ignore"``); the ones clients commonly send that
steer sampling are all listed, including llama-server's own.

Wiring a refused field in: move its row to ``APPLIED``, give it its real type in ``schemas._Generation`` and pass
it to the engine ``Request`` in ``completions.py`` (``_request``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refused:
    neutral: tuple = ()  # JSON values accepted because they change nothing (null is always accepted)
    why: str = "not supported"  # the reason the 400 gives: "<field> is <why>; only <neutral> is accepted"

    def accepts(self, value: Any) -> bool:
        return value is None or any(_same(value, n) for n in self.neutral)

    def allowed(self) -> str:
        return " or ".join([json.dumps(n) for n in self.neutral] + ["null"])


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1 (Python's True == 1 would let ``n: true`` through)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


NONE = "not supported"

REFUSED: dict[str, Refused] = {
    # completions: insertion
    "suffix": Refused(("",), NONE),
    # chat: OpenAI's older names for tools and tool_choice (applied)
    "functions": Refused(([],), "not supported: use tools"),
    "function_call": Refused(("none", "auto"), "not supported: use tool_choice"),
    # llama-server's other samplers, at their off values
    "mirostat": Refused((0,), NONE),
    "typical_p": Refused((1,), NONE),
    "tfs_z": Refused((1,), NONE),
    "top_n_sigma": Refused((-1,), NONE),
    "xtc_probability": Refused((0,), NONE),
    "dry_multiplier": Refused((0,), NONE),
    "dynatemp_range": Refused((0,), NONE),
    "samplers": Refused((), NONE),  # llama-server's sampler order
    "n_probs": Refused((0,), NONE),  # llama-server's per-token probabilities (logprobs is applied)
    "t_max_predict_ms": Refused((0,), NONE),  # llama-server's generation time limit
}

# field -> what it does here (docs/server.md lists the same)
APPLIED: dict[str, str] = {
    "model": "the preset (any name with a single preset)",
    "prompt": "completions: a string, strings, token ids or lists of token ids (one choice each)",
    "messages": "chat: rendered with the preset's chat template",
    "max_tokens": "generated tokens at most",
    "max_completion_tokens": "chat: the same, wins over max_tokens",
    "n_predict": "llama-server's name for max_tokens, used without max_tokens; -1: until EOS or the slot's end",
    "temperature": "0 is greedy",
    "top_k": "0: off",
    "top_p": "1: off",
    "seed": "the sampler's seed at temperature > 0",
    "stop": "up to 16 strings, never emitted in part",
    "stream": "server-sent events",
    "stream_options": "include_usage: a last chunk with usage and timings",
    "logprobs": "streamed too: each chunk carries its tokens' logprobs",
    "top_logprobs": "chat: with logprobs",
    "echo": "completions: the prompt before the text (and its logprobs)",
    "cache_prompt": "reuse a cached prefix (docs/cache.md)",
    "ignore_eos": "keep generating past end-of-generation tokens",
    "return_tokens": "the token ids in each choice",
    "speculative": "pydflash: {enabled, n_max} per request",
    "sampling_mode": "pydflash: how drafts are accepted at temperature > 0 (rejection or match)",
    "tools": "chat: functions the model may call, rendered into the prompt (tools.py)",
    "tool_choice": "chat: auto (text or calls), none, required or a named function (both grammar-constrained)",
    "parallel_tool_calls": "chat: false allows one call per answer",
    # sampling controls (engine/controls.py), on the target and the drafter alike; server/controls.py maps them
    "logit_bias": "{token id: bias} (OpenAI) or [[id or text, bias], ...] (llama-server; false bans); -100 bans",
    "min_p": "0: off",
    "presence_penalty": "in [-2, 2], over the last repeat_last_n tokens",
    "frequency_penalty": "in [-2, 2], over the last repeat_last_n tokens",
    "repeat_penalty": "llama-server's, in [0.001, 10]; 1: off",
    "repeat_last_n": "the penalties' window over prompt + output; 64 by default, -1: all, 0: off",
    "grammar": "llama-server's GBNF: only what it allows is committed",
    "json_schema": "llama-server's: output that validates against the schema",
    "response_format": "text, json_object (any object) or json_schema (its schema, always strict)",
    # more than one choice per prompt
    "n": "choices per prompt, each with its own seed stream, sharing the prompt's prefill; at most the slots",
    "best_of": "only equal to n: choosing the best needs a score the server does not compute",
}

NO_EFFECT: dict[str, str] = {
    "user": "an end-user id for the client's own records",
    "id_slot": "/completion: the engine picks the slot; the prompt cache finds a cached prefix in any",
    "mirostat_tau": "only acts with mirostat, which is refused",
    "mirostat_eta": "only acts with mirostat, which is refused",
    "xtc_threshold": "only acts with xtc_probability, which is refused",
}

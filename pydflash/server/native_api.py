"""llama-server's native endpoints on a worker, in llama-server's shapes (its tools/server/README.md):

- ``POST /completion``: one prompt, ``n_predict`` (default -1: until EOS or the end of the slot), its sampling
  fields as on ``/v1/completions`` (a field that would change the output and is not applied is a 400 naming it,
  ``fields.py``); the answer has ``content``, ``tokens_predicted``, ``tokens_evaluated``, ``stop``, ``stop_type``,
  ``timings``... With ``stream``, each event is ``{"content", "tokens", "stop": false}`` and the last one the whole
  summary with ``stop: true`` (no ``[DONE]``, as llama-server).
- ``GET /props``: ``default_generation_settings``, ``total_slots``, ``model_path``, ``chat_template``.
- ``GET /slots``: each slot's id, state, context and the request it runs.
- ``POST /apply-template``: a chat body -> ``{"prompt": ...}``, rendered as ``/v1/chat/completions`` renders it.

Generation goes through ``Completions`` (tokenizing, submission, cancellation and metrics are the same as the OpenAI
routes'); this module only reshapes bodies and answers.
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Callable, Optional

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request as HTTPRequest

from . import ops, tools
from . import schemas as S
from .completions import SEND_TIMEOUT_S, Completions
from .engine_client import EngineClient
from .preset import Preset


class NativeAPI:
    def __init__(self, gen: Completions, engine: EngineClient, preset: Preset):
        self.gen = gen
        self.engine = engine
        self.preset = preset

    # --- POST /completion -----------------------------------------------------------------------------------------
    async def completion(self, body: S.NativeCompletionRequest, http: HTTPRequest):
        """Served by the OpenAI handler (the same fields, applied or refused the same way), its answer reshaped."""
        data = body.model_dump(exclude_unset=True, exclude={"id_slot"})
        data.setdefault("n_predict", -1)  # llama-server's default: until EOS or the end of the slot
        data["return_tokens"] = True
        if body.stream:
            data["stream_options"] = {"include_usage": True}  # the last event's summary comes from its usage chunk
        out = await self.gen.completion(S.CompletionRequest.model_validate(data), http)
        if body.stream:
            frames = _native_frames(out.body_iterator, body, self._summary)
            return EventSourceResponse(frames, ping=15, sep="\n", send_timeout=SEND_TIMEOUT_S)
        c = out.choices[0]
        return self._summary(body, c.text, c.tokens if body.return_tokens else [], c.finish_reason, out.usage,
                             out.timings)

    def _summary(self, body: S.NativeCompletionRequest, content: str, tokens: list[int], finish: str,
                 usage: S.Usage, timings: Optional[S.Timings]) -> dict:
        return {
            "index": 0, "content": content, "tokens": tokens, "id_slot": -1, "stop": True, "model": self.gen.model,
            "tokens_predicted": usage.completion_tokens, "tokens_evaluated": usage.prompt_tokens,
            "tokens_cached": usage.prompt_tokens_details.cached_tokens, "generation_settings": self._settings(body),
            "prompt": body.prompt if isinstance(body.prompt, str) else self.gen.tokenizer.echo_text(body.prompt),
            "has_new_line": "\n" in content, "truncated": False,
            # the engine's "stop" is EOS or a stop string, which is cut from the text: both read "eos" here
            "stop_type": "eos" if finish == "stop" else "limit", "stopping_word": "",
            "timings": timings.model_dump() if timings is not None else None,
        }

    def _settings(self, body=None) -> dict:
        """llama-server's generation settings (the request's, or the defaults)."""
        info = self.engine.info
        b = body or S.NativeCompletionRequest(prompt="x")
        return {"n_predict": b.n_predict if b.n_predict is not None else -1, "seed": b.seed,
                "temperature": b.temperature, "top_k": b.top_k, "top_p": b.top_p, "min_p": 0.0,
                "stop": list(b.stop), "max_tokens": b.max_tokens if b.max_tokens is not None else -1,
                "ignore_eos": b.ignore_eos, "stream": b.stream, "n_probs": 0, "grammar": "",
                "samplers": ["top_k", "top_p", "temperature"], "n_ctx": info.n_ctx_slot, "model": self.gen.model,
                "speculative": info.drafter, "speculative.n_max": max(0, info.block_size - 1)}

    # --- GET /props, GET /slots -----------------------------------------------------------------------------------
    def props(self) -> dict:
        info, template = self.engine.info, self.gen.template
        target, drafter = self.preset.pair_files()
        slot = {"id": 0, "id_task": -1, "n_ctx": info.n_ctx_slot, "speculative": info.drafter,
                "is_processing": False, "params": self._settings()}
        return {"default_generation_settings": slot, "total_slots": info.n_slots, "model_path": target,
                "model_alias": self.preset.name, "drafter_path": drafter, "n_ctx": info.n_ctx_slot,
                "chat_template": template.source, "chat_template_name": template.name,
                "chat_template_caps": {"supports_tools": tools.native_format(template)},
                "bos_token": info.bos_text, "eos_token": info.eos_text, "modalities": {"vision": False, "audio": False},
                "build_info": "pydflash", "is_sleeping": False}

    async def slots(self) -> list[dict]:
        info = self.engine.info
        out = []
        for s in await self.engine.call(ops.slot_states):
            progress = {"has_next_token": s["is_processing"], "n_remain": s.pop("n_remain"),
                        "n_decoded": s.pop("n_decoded")}
            out.append({**s, "n_ctx": info.n_ctx_slot, "speculative": info.drafter, "next_token": progress})
        return out

    # --- POST /apply-template -------------------------------------------------------------------------------------
    def apply_template(self, body: S.ChatCompletionRequest) -> S.ApplyTemplateResponse:
        template = self.gen.template
        tp = tools.plan(body.tool_dicts(), body.tool_choice_value(), body.parallel_tool_calls, template)
        return S.ApplyTemplateResponse(prompt=tools.render(template, body.template_messages(), tp))


async def _native_frames(chunks: AsyncIterator[dict], body: S.NativeCompletionRequest,
                         summary: Callable[..., dict]) -> AsyncIterator[dict]:
    """The OpenAI handler's SSE frames as llama-server's: one event per text chunk, then the summary (from the
    usage chunk) with ``stop: true``; an error event passes as it is; ``[DONE]`` is dropped. Closing this generator
    (the client went away) closes the handler's, which cancels the request."""
    n, finish = 0, None
    try:
        async for frame in chunks:
            if frame["data"] == "[DONE]":
                continue
            obj = json.loads(frame["data"])
            if "error" in obj:
                yield frame
                continue
            if not obj["choices"]:  # the usage chunk: the end
                yield {"data": json.dumps(summary(body, "", [], finish, S.Usage.model_validate(obj["usage"]),
                                                  S.Timings.model_validate(obj["timings"])))}
                continue
            c = obj["choices"][0]
            finish = c["finish_reason"] or finish
            if c["text"] or c.get("tokens"):
                n += len(c.get("tokens") or [])
                yield {"data": json.dumps({"index": 0, "content": c["text"], "tokens": c.get("tokens") or [],
                                           "stop": False, "id_slot": -1, "tokens_predicted": n})}
    finally:
        await chunks.aclose()

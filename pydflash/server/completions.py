"""OpenAI completions and chat completions over one engine (the worker side of the server).

A handler tokenizes the prompts with the worker's own tokenizer (``tokenizer.py``: not on the engine's thread),
turns the validated body into engine ``Request``s, submits them to the engine and waits for each to be accepted,
so every bad input (an out-of-vocabulary id, a prompt that does not fit) is a 4xx before any stream byte. Then it
either collects the events into one response or streams them as SSE chunks. A client that goes away cancels its
requests at once, which frees their slots on the engine's next turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Sequence

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request as HTTPRequest

from ..engine.request import Request, Result
from ..errors import ContextOverflow, InvalidRequest
from . import schemas as S
from . import tools
from .chat import ChatTemplate
from .choices import choice_seed, n_choices
from .controls import engine_kwargs, field_error
from .errors import envelope, to_api_error
from .engine_client import ACCEPTED, EngineClient, Sink
from .metrics import REQUESTS, StepRecorder
from .scoring import ScoreService
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)
DISCONNECT_POLL_S = 0.25
SEND_TIMEOUT_S = 30.0


class ClientGone(Exception):
    """The HTTP client disconnected; its requests were cancelled."""


@dataclass
class Call:
    """One HTTP call: its engine requests (one per prompt) and what has come back for them."""

    kind: str  # "completion" or "chat"
    model: str
    reqs: list[Request]
    prompts: list[list[int]]  # the tokens of each request's prompt (for usage, echo and logprobs)
    n: int = 1  # choices per prompt: reqs[k * n + j] is prompt k's choice j
    sink: Sink = field(default_factory=Sink)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    results: dict[int, Result] = field(default_factory=dict)
    backlog: list = field(default_factory=list)  # replies read while waiting for acceptances, not yet consumed
    checked: float = 0.0  # when the client was last checked for a disconnect (monotonic)
    counted: bool = False  # its outcome is in the metrics (once: an error is not also a cancellation)
    tools: Optional[tools.ToolPlan] = None  # chat with tools to read calls from (tools.py)

    def index(self, request_id: int) -> int:
        return next(i for i, r in enumerate(self.reqs) if r.id == request_id)


@dataclass
class StreamLogprobs:
    """A stream's ``logprobs``: each frame's tokens scored as the frame is sent, after its choice's prompt and the
    tokens sent before (the scorer keeps that prefix in its KV, so a frame decodes only its own tokens)."""

    scorer: ScoreService
    kind: str  # "completion" (the legacy format) or "chat"
    top_n: int
    prompts: list[list[int]]  # each choice's prompt
    sent: dict[int, list[int]] = field(default_factory=dict)  # choice -> prompt + the tokens scored so far
    offset: dict[int, int] = field(default_factory=dict)  # choice -> text offset of its next token (legacy format)

    async def echo(self, i: int) -> dict:
        """Completions with echo: the prompt's own logprobs, with the frame that echoes it."""
        self.sent[i] = list(self.prompts[i])
        out = await self.scorer.completion_span(self.sent[i], 0, self.top_n)
        self.offset[i] = sum(len(t) for t in out.tokens)
        return out.model_dump()

    async def frame(self, i: int, tokens: list[int]) -> dict:
        sent = self.sent.setdefault(i, list(self.prompts[i]))
        first = len(sent)
        sent += tokens
        if self.kind == "chat":
            return (await self.scorer.chat_span(sent, first, self.top_n)).model_dump()
        out = await self.scorer.completion_span(sent, first, self.top_n, self.offset.get(i, 0))
        self.offset[i] = self.offset.get(i, 0) + sum(len(t) for t in out.tokens)
        return out.model_dump()


class Completions:
    def __init__(self, engine: EngineClient, tokenizer: Tokenizer, model: str, template: ChatTemplate,
                 recorder: StepRecorder, scorer: ScoreService):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = model
        self.template = template
        self.recorder = recorder
        self.scorer = scorer

    # --- endpoints ------------------------------------------------------------------------------------------------
    async def completion(self, body: S.CompletionRequest, http: HTTPRequest):
        n = n_choices(body, self.engine.info.n_slots)
        controls = await engine_kwargs(body, self.tokenizer, None)
        prompts = [p for p in await self._completion_prompts(body.prompts()) for _ in range(n)]
        reqs = [self._request(p, body, controls, i % n, n) for i, p in enumerate(prompts)]
        call = Call("completion", self.model, reqs, prompts, n=n, id="cmpl-" + uuid.uuid4().hex)
        await self._start(call, body)
        echo = [self.tokenizer.echo_text(p) for p in call.prompts] if body.echo else None
        if body.stream:
            lp = (None if body.logprobs is None
                  else StreamLogprobs(self.scorer, "completion", body.logprobs, call.prompts))
            return self._stream(call, http, body, echo_text=echo, logprobs=lp)
        await self._collect(call, http)
        choices = []
        for i, req in enumerate(call.reqs):
            res = call.results[req.id]
            text = res.text
            logprobs = None
            if body.logprobs is not None:
                logprobs = await self.scorer.completion_logprobs(call.prompts[i], res.tokens, body.logprobs, body.echo)
            if echo is not None:
                text = echo[i] + text
            choice = S.CompletionChoice(index=i, text=text, finish_reason=res.finish_reason, logprobs=logprobs)
            if body.return_tokens:
                choice.tokens = list(res.tokens)
            choices.append(choice)
        self._count(call, "ok")
        return S.CompletionResponse(id=call.id, created=call.created, model=self.model, choices=choices,
                                    usage=self._usage(call), timings=self._timings(call))

    async def chat(self, body: S.ChatCompletionRequest, http: HTTPRequest):
        tp = tools.plan(body.tool_dicts(), body.tool_choice_value(), body.parallel_tool_calls, self.template)
        text = tools.render(self.template, body.template_messages(), tp)
        add_special = not self.template.emits_bos
        self._check_prompt_bytes(text)
        tokens = await self.tokenizer.tokenize(text, add_special, True)
        if not tokens:
            raise InvalidRequest("the rendered chat prompt is empty")
        n = n_choices(body, self.engine.info.n_slots)
        controls = await engine_kwargs(body, self.tokenizer, tools.grammar(tp))
        call = Call("chat", self.model, [self._request(tokens, body, controls, j, n) for j in range(n)], [tokens] * n,
                    n=n, id="chatcmpl-" + uuid.uuid4().hex, tools=tp if tp.parses else None)
        await self._start(call, body)
        if body.stream:
            lp = StreamLogprobs(self.scorer, "chat", body.top_logprobs or 0, call.prompts) if body.logprobs else None
            return self._stream(call, http, body, logprobs=lp)
        await self._collect(call, http)
        choices = []
        for i, req in enumerate(call.reqs):
            res = call.results[req.id]
            logprobs = None
            if body.logprobs:
                logprobs = await self.scorer.chat_logprobs(tokens, res.tokens, body.top_logprobs or 0)
            content, calls = tools.split(res.text, call.tools) if call.tools is not None else (res.text, [])
            message = S.ChatMessageOut(role="assistant", content=content,
                                       tool_calls=[c.message() for c in calls] or None)
            choice = S.ChatChoice(index=i, message=message, finish_reason="tool_calls" if calls else res.finish_reason,
                                  logprobs=logprobs)
            if body.return_tokens:
                choice.tokens = list(res.tokens)
            choices.append(choice)
        self._count(call, "ok")
        return S.ChatCompletionResponse(id=call.id, created=call.created, model=self.model, choices=choices,
                                        usage=self._usage(call), timings=self._timings(call))

    # --- requests -------------------------------------------------------------------------------------------------
    async def _completion_prompts(self, prompts) -> list[list[int]]:
        """Each prompt as tokens: strings are tokenized with BOS and special-token text parsed (a Gemma-format
        transcript's ``<start_of_turn>`` is one token), as llama-server does."""
        out = []
        for p in prompts:
            if isinstance(p, str):
                self._check_prompt_bytes(p)
                toks = await self.tokenizer.tokenize(p, True, True)
            else:
                toks = list(p)
            if not toks:
                raise InvalidRequest("empty prompt")
            out.append(toks)
        return out

    def _check_prompt_bytes(self, text: str) -> None:
        """Refuse a prompt too long in bytes to fit the slot in any tokenization, before it is tokenized (about
        1 s per MB on a CPU, a wait the client need not have for a 400)."""
        limit = self.engine.info.prompt_bytes_limit()
        if limit is None or len(text) * 4 <= limit:  # at most 4 bytes per character: no encoding needed
            return
        n = len(text.encode("utf-8", "surrogatepass"))
        if n > limit:
            info = self.engine.info
            raise ContextOverflow(
                f"the prompt has {n} bytes; a token covers at most {info.max_token_bytes} bytes of this vocabulary, "
                f"so it needs more tokens than the slot context ({info.n_ctx_slot})")

    def _request(self, tokens: Sequence[int], body, controls: dict, choice: int = 0, n: int = 1) -> Request:
        """``controls``: ``controls.engine_kwargs`` of the body; ``choice``: the index among the prompt's ``n``
        choices (its seed; the first keeps its prefill for the others)."""
        draft_max = None
        spec = body.speculative
        if spec is not None:
            draft_max = 0 if not spec.enabled else spec.n_max
        try:
            return Request(list(tokens), max_tokens=self._max_tokens(body, len(tokens)), stop=list(body.stop),
                           temperature=body.temperature, top_k=body.top_k or 0, top_p=body.top_p,
                           seed=choice_seed(body.seed, choice), sampling_mode=body.sampling_mode,
                           draft_max=draft_max, ignore_eos=body.ignore_eos, cache_prompt=body.cache_prompt,
                           share_prompt=n > 1 and choice == 0, **controls)
        except ValueError as exc:  # Request validates its own fields; anything it refuses is the client's
            raise field_error(InvalidRequest(str(exc)), body) from exc

    def _max_tokens(self, body, n_prompt: int) -> int:
        """The body's limit; without one (chat, or n_predict: -1), whatever the slot still holds (as OpenAI's
        default for chat)."""
        n = body.max_tokens  # the schema fills OpenAI's default for completions, and n_predict's value
        if n is not None:
            return n
        info = self.engine.info  # sizes fixed at load: the engine owns everything else
        return max(1, info.n_ctx_slot - n_prompt - info.block_size)

    async def _start(self, call: Call, body=None) -> None:
        """Submit every request and wait until each is accepted; on any refusal cancel the others and raise.

        With n > 1 each prompt's first choice goes first and the others once it has its first event, which comes
        after its prompt is prefilled: that prefill is then in the KV (kept for them, ``Request.share_prompt``),
        and the others reuse it through the prompt cache instead of prefilling the prompt n times at once."""
        leaders = call.reqs[::call.n]
        await self._submit(call, leaders, body)
        if call.n > 1:
            await self._first_events(call, leaders)
            await self._submit(call, [r for i, r in enumerate(call.reqs) if i % call.n], body)

    async def _submit(self, call: Call, reqs: list[Request], body) -> None:
        now = time.monotonic()
        for r in reqs:
            self.recorder.started[r.id] = now
            self.engine.submit(r, call.sink)
        pending = {r.id for r in reqs}
        error: Optional[BaseException] = None
        while pending:
            rid, item = await call.sink.get()
            if item is ACCEPTED or item == ACCEPTED:
                pending.discard(rid)
            elif isinstance(item, BaseException):
                pending.discard(rid)
                error = error or item
            else:  # an event can overtake another request's acceptance: keep it for the reader
                call.backlog.append((rid, item))
        if error is not None:
            self._fail_start(call, error, body)

    async def _first_events(self, call: Call, reqs: list[Request]) -> None:
        """Wait until each of ``reqs`` has sent an event (kept in the backlog for the reader)."""
        waiting = {r.id for r in reqs} - {rid for rid, _ in call.backlog}
        while waiting:
            rid, item = await call.sink.get()
            if isinstance(item, BaseException):
                self._fail_start(call, item, body=None)
            call.backlog.append((rid, item))
            waiting.discard(rid)

    def _fail_start(self, call: Call, error: BaseException, body) -> None:
        # a 4xx (or 503): the router counts what it answers, so nothing is counted here
        self._cancel(call)
        call.counted = True
        raise field_error(error, body) if body is not None else error

    def _cancel(self, call: Call) -> None:
        for r in call.reqs:
            if r.id not in call.results:
                self.engine.cancel(r.id)
            self.recorder.forget(r.id)

    async def _next(self, call: Call, http: HTTPRequest):
        """The next (request id, event | error). The client is checked for a disconnect every DISCONNECT_POLL_S
        while waiting and between events (events can arrive faster than that for as long as it generates)."""
        if call.backlog:
            return call.backlog.pop(0)
        get = asyncio.ensure_future(call.sink.get())
        try:
            while True:
                now = time.monotonic()
                if now - call.checked >= DISCONNECT_POLL_S:
                    call.checked = now
                    if await http.is_disconnected():
                        raise ClientGone()
                done, _ = await asyncio.wait({get}, timeout=DISCONNECT_POLL_S)
                if done:
                    return get.result()
        finally:
            if not get.done():
                get.cancel()

    async def _collect(self, call: Call, http: HTTPRequest) -> None:
        try:
            while len(call.results) < len(call.reqs):
                rid, item = await self._next(call, http)
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    call.results[rid] = item.result
        except ClientGone:
            self._cancel(call)
            self._count(call, "cancelled")
            raise
        except BaseException:
            self._cancel(call)
            self._count(call, "error")
            raise

    # --- streaming ------------------------------------------------------------------------------------------------
    def _stream(self, call: Call, http: HTTPRequest, body, echo_text: Optional[list[str]] = None,
                logprobs: Optional[StreamLogprobs] = None):
        # send_timeout: a client that stops reading frees its slot instead of holding it
        frames = self._frames(call, http, body.include_usage, echo_text, body.return_tokens, logprobs)
        return EventSourceResponse(frames, ping=15, sep="\n", send_timeout=SEND_TIMEOUT_S)

    async def _frames(self, call: Call, http: HTTPRequest, include_usage: bool, echo_text: Optional[list[str]],
                      return_tokens: bool, lp: Optional[StreamLogprobs] = None) -> AsyncIterator[dict]:
        chunk = _ChunkMaker(call, return_tokens)
        readers = {i: tools.CallReader(call.tools) for i in range(len(call.reqs))} if call.tools is not None else {}
        try:
            if call.kind == "chat":
                for i in range(len(call.reqs)):
                    yield chunk.frame(i, role="assistant", text="")
            for i, t in enumerate(echo_text or []):
                yield chunk.frame(i, text=t, logprobs=await lp.echo(i) if lp is not None else None)
            while len(call.results) < len(call.reqs):
                # no disconnect polling here: EventSourceResponse listens for the client's disconnect itself and
                # cancels this generator (the finally below cancels the requests). A task and a timer per frame,
                # as _next waits, cost the event loop ~1/5 of its time at 16 streams (and with the engine on a
                # thread of the worker, that time is the engine's GIL too)
                rid, item = call.backlog.pop(0) if call.backlog else await call.sink.get()
                if isinstance(item, BaseException):
                    self._count(call, "error")
                    yield {"data": json.dumps({"error": _error_body(item)})}
                    yield {"data": "[DONE]"}
                    return
                i = call.index(rid)
                reader = readers.get(i)
                # this frame's tokens scored as it is sent (a held-back partial character still sends its tokens'
                # logprobs, with empty text)
                try:
                    logprobs = await lp.frame(i, item.tokens) if lp is not None and item.tokens else None
                except Exception as exc:  # the scorer failed: the stream ends with the error, as an engine one
                    log.exception("scoring a stream frame failed")
                    self._count(call, "error")
                    yield {"data": json.dumps({"error": _error_body(exc)})}
                    yield {"data": "[DONE]"}
                    return
                if reader is not None:  # content as it comes, each tool call once its block is closed
                    for frame in chunk.parts(i, reader.feed(item.text) + (reader.finish() if item.finished else [])):
                        yield frame
                    if logprobs is not None:
                        yield chunk.logprobs(i, logprobs)
                elif item.text or (return_tokens and item.tokens) or logprobs is not None:
                    yield chunk.frame(i, text=item.text, tokens=item.tokens, logprobs=logprobs)
                if item.finished:
                    call.results[rid] = item.result
                    called = reader is not None and reader.calls
                    yield chunk.frame(i, finish="tool_calls" if called else item.result.finish_reason)
            if include_usage:
                yield chunk.usage(self._usage(call), self._timings(call))
            self._count(call, "ok")
            yield {"data": "[DONE]"}
        finally:  # also on client disconnect (the generator is cancelled) or an error above
            if len(call.results) < len(call.reqs):
                self._cancel(call)
                self._count(call, "cancelled")

    # --- response parts -------------------------------------------------------------------------------------------
    def _usage(self, call: Call) -> S.Usage:
        """Each prompt counts once, as its first choice's (the others reuse its prefill: timings.cache_n has their
        cached tokens too); completion tokens sum over every choice."""
        prompt = sum(len(p) for p in call.prompts[::call.n])
        completion = sum(len(r.tokens) for r in call.results.values())
        leaders = [call.results[r.id] for r in call.reqs[::call.n] if r.id in call.results]
        cached = sum(getattr(r.stats, "n_cached", 0) for r in leaders)
        return S.Usage.of(prompt, completion, cached)

    def _timings(self, call: Call) -> S.Timings:
        st = [r.stats for r in call.results.values()]
        return S.Timings.of(
            prompt_n=sum(s.n_prompt for s in st), prompt_ms=1000 * sum(s.t_prefill for s in st),
            predicted_n=sum(s.n_generated for s in st), predicted_ms=1000 * max((s.t_decode for s in st), default=0.0),
            draft_n=sum(s.n_drafted for s in st), draft_n_accepted=sum(s.n_accepted for s in st),
            cache_n=sum(getattr(s, "n_cached", 0) for s in st),
            steps=sum(s.n_steps for s in st), draft_steps=sum(s.n_draft_steps for s in st),
            **{f"{part}_ms": 1000 * sum(getattr(s, f"t_{part}") for s in st)
               for part in ("draft", "verify", "commit", "host")},
        )

    def _count(self, call: Call, outcome: str) -> None:
        """Count the call's outcome, only the first time: an error ends a stream, whose cleanup must not count it
        again as cancelled."""
        if not call.counted:
            call.counted = True
            REQUESTS.labels(self.model, call.kind, outcome).inc()


class _ChunkMaker:
    """SSE frames of one call: the same id and created time in every chunk."""

    def __init__(self, call: Call, return_tokens: bool = False):
        self.call = call
        self.return_tokens = return_tokens
        self.n_calls: dict[int, int] = {}  # tool calls sent so far per choice (their delta index)

    def _base(self) -> dict:
        c = self.call
        obj = "chat.completion.chunk" if c.kind == "chat" else "text_completion"
        return {"id": c.id, "object": obj, "created": c.created, "model": c.model}

    def frame(self, index: int, text: Optional[str] = None, role: Optional[str] = None,
              finish: Optional[str] = None, tokens: Optional[list[int]] = None,
              logprobs: Optional[dict] = None) -> dict:
        if self.call.kind == "chat":
            delta = {}
            if role:
                delta["role"] = role
            if text is not None and finish is None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if self.return_tokens and tokens is not None:
            choice["tokens"] = list(tokens)  # this frame's token ids (its text may hold back a partial character)
        return {"data": json.dumps({**self._base(), "choices": [choice]})}

    def parts(self, index: int, parts: list) -> list[dict]:
        """Frames of a tools.CallReader's output: content text, and per call OpenAI's two deltas (index, id, type
        and name with empty arguments, then the arguments), as the openai client reassembles them."""
        frames = []
        for p in parts:
            if isinstance(p, str):
                frames.append(self.frame(index, text=p))
                continue
            k = self.n_calls.get(index, 0)
            self.n_calls[index] = k + 1
            head = {"index": k, "id": p.id, "type": "function", "function": {"name": p.name, "arguments": ""}}
            frames.append(self._delta(index, {"tool_calls": [head]}))
            frames.append(self._delta(index, {"tool_calls": [{"index": k, "function": {"arguments": p.arguments}}]}))
        return frames

    def _delta(self, index: int, delta: dict, logprobs: Optional[dict] = None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return {"data": json.dumps({**self._base(), "choices": [choice]})}

    def logprobs(self, index: int, logprobs: dict) -> dict:
        """A chat frame with no content of its own: the logprobs of tokens a tool-call reader holds back."""
        return self._delta(index, {}, logprobs)

    def usage(self, usage: S.Usage, timings: S.Timings) -> dict:
        body = {**self._base(), "choices": [], "usage": usage.model_dump(), "timings": timings.model_dump()}
        return {"data": json.dumps(body)}


def _error_body(exc: BaseException) -> dict:
    return envelope(to_api_error(exc))["error"]

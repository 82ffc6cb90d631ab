"""Request and response bodies of the OpenAI-compatible API (pydantic v2).

Requests
- Strict types (``strict=True``): ``"16"`` is not an integer, ``true`` is not a number. The published JSON schema
  is then what the server really accepts, which schemathesis checks in both directions.
- A field that would change the output is applied or refused, never accepted and ignored: ``fields.py`` lists
  them. Each refused field is declared here with its neutral values (``n: 1``, ``logit_bias: {}``, null) as its
  JSON schema, and any other value is a 400 naming it. Fields nobody lists are dropped (``extra="ignore"``).
- Every string is ``Text``: valid Unicode. Python's ``json`` accepts a lone surrogate (``"\\ud800"``), which cannot
  be encoded to UTF-8 for the tokenizer; it is refused here, once, for every field.
- ``None`` for an optional sampling field means "the default". After validation these fields hold the default,
  never ``None`` (except the chat ``max_tokens``: ``None`` there means "until the context is full").

Responses follow OpenAI's shapes, plus llama-server's ``timings`` object and a ``meta`` extension on models.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .fields import REFUSED

COMPLETION_MAX_TOKENS_DEFAULT = 16  # OpenAI's documented default for /v1/completions
TEMPERATURE_DEFAULT = 1.0  # OpenAI's documented default (llama-server uses 0.8); 0 means greedy
MAX_STOP = 16  # OpenAI allows 4; lm-eval's humaneval sends 5, llama-server and vLLM set no limit
MAX_LOGPROBS = 5  # top-N alternatives per token, OpenAI's limit for /v1/completions


# --- shared field types --------------------------------------------------------------------------------------------


def _valid_unicode(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PydanticCustomError(
            "invalid_unicode", "string is not valid Unicode: lone surrogate at index {index}", {"index": exc.start}
        ) from None
    return s


Text = Annotated[str, AfterValidator(_valid_unicode)]  # every string a client sends


def _integral(v: Any) -> Any:
    # JSON Schema's "integer" includes 5.0 (schemathesis sends it); Python's json makes it a float.
    return int(v) if isinstance(v, float) and v.is_integer() else v


# Every integer a client sends: 5 and 5.0, not "5" or true. Bounds sit inside (before the float conversion wraps
# them) so that they reach the JSON schema as minimum/maximum.
Int = Annotated[int, BeforeValidator(_integral)]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
NonNegativeInt = Annotated[int, Field(ge=0), BeforeValidator(_integral)]
TopK = Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(_integral)]  # it becomes a C int
TopN = Annotated[int, Field(ge=0, le=MAX_LOGPROBS), BeforeValidator(_integral)]
TokenId = NonNegativeInt  # the upper bound (n_vocab) is the engine's check


def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite_logprob(v: float) -> float:
    # JSON has no -inf (Starlette refuses NaN/inf); OpenAI documents -9999.0 as "very unlikely".
    return v if math.isfinite(v) else -9999.0


LogProb = Annotated[float, AfterValidator(_finite_logprob)]


class _Body(BaseModel):
    """Base of every request body."""

    model_config = ConfigDict(extra="ignore", strict=True)


def request_models() -> list[type]:
    """Every request model (and its pieces): errors.py tells a client's bad body from our own bad response."""
    out, todo = [], [_Body]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


# --- refused fields (fields.REFUSED): declared with their neutral values, refused at any other ----------------------


def _refuse(cls, v: Any, info: ValidationInfo) -> Any:
    row = REFUSED[info.field_name]
    if row.accepts(v):
        return v
    raise PydanticCustomError("unsupported", "{field} is {why}; only {allowed} is accepted",
                              {"field": info.field_name, "why": row.why, "allowed": row.allowed()})


# The JSON schema of each is the enum of its accepted values: what the server really takes, as schemathesis checks.
_Refusals = create_model(
    "_Refusals", __base__=_Body,
    __validators__={"_refuse": field_validator(*REFUSED)(_refuse)},
    **{name: (Annotated[Optional[Any], WithJsonSchema({"enum": [*row.neutral, None]})], None)
       for name, row in REFUSED.items()},
)


# --- request pieces ------------------------------------------------------------------------------------------------


class StreamOptions(_Body):
    include_usage: bool = False  # one last chunk with `usage` and empty `choices` before [DONE]


class SpeculativeOptions(_Body):
    """pydflash extension: per-request control of DFlash drafting."""

    enabled: bool = True
    n_max: Optional[NonNegativeInt] = None  # most drafted tokens per step; clamped to the drafter's block


# logit_bias: OpenAI's {"<token id>": bias}, or llama-server's [[id or token text, bias], ...] (also text keys in
# the object form); a bias of false bans the token. server/controls.py turns either into {token id: bias}.
Bias = Union[Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)], Literal[False]]
# strict mode takes a tuple only as a tuple; JSON has arrays, so a pair arrives as a list
BiasPair = Annotated[tuple[Union[TokenId, Text], Bias],
                     BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]
LogitBias = Union[dict[Text, Bias], list[BiasPair]]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]  # OpenAI's presence / frequency range


class ResponseFormatText(_Body):
    type: Literal["text"]


class ResponseFormatJSONObject(_Body):
    type: Literal["json_object"]
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")  # llama-server's extension: this schema


class JSONSchemaSpec(_Body):
    name: Optional[Text] = None
    description: Optional[Text] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")  # None: any JSON object
    strict: Optional[bool] = None  # the output always follows the schema (a grammar), strict or not


class ResponseFormatJSONSchema(_Body):
    type: Literal["json_schema"]
    json_schema: JSONSchemaSpec


ResponseFormat = Annotated[Union[ResponseFormatText, ResponseFormatJSONObject, ResponseFormatJSONSchema],
                           Field(discriminator="type")]


class _Generation(_Refusals):
    """Fields common to /v1/completions and /v1/chat/completions (and, refused, every field of fields.REFUSED)."""

    model: Optional[Text] = None  # a preset name; None or "any": the most recently used resident model
    temperature: Optional[float] = Field(TEMPERATURE_DEFAULT, ge=0, allow_inf_nan=False)
    top_p: Optional[float] = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: Optional[TopK] = 0  # extension (llama-server, vLLM); 0 = off
    stop: Union[Text, Annotated[list[Text], Field(max_length=MAX_STOP)], None] = None  # after validation: list[str]
    seed: Optional[Int] = None  # accepted (clients send it by default); seeds the sampler when temperature > 0
    # extension: how drafts are accepted when temperature > 0 (engine.request.Request); None: "rejection"
    sampling_mode: Optional[Literal["rejection", "match"]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    # llama-server's name for max_tokens, used when max_tokens is absent; -1: until EOS or the end of the slot
    n_predict: Optional[Annotated[int, Field(ge=-1), BeforeValidator(_integral)]] = None
    user: Optional[Text] = None  # no effect on the output
    speculative: Optional[SpeculativeOptions] = None  # after validation: never None
    cache_prompt: Optional[bool] = True  # reuse a cached prefix of this prompt (prompt cache)
    ignore_eos: Optional[bool] = False  # extension (llama-server): keep generating past end-of-generation tokens
    return_tokens: Optional[bool] = False  # extension (llama-server): the generated token ids in each choice
    # sampling controls (server/controls.py maps them onto the engine Request); None: off
    logit_bias: Optional[LogitBias] = None
    min_p: Optional[float] = Field(None, ge=0, le=1, allow_inf_nan=False)
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    # llama-server's; 1: off. At least 1e-3: a positive logit is divided by it, and 5e-324 makes it inf (the
    # engine's range is (0, 10], which such a value passes, and the engine then fails on the row)
    repeat_penalty: Optional[float] = Field(None, ge=1e-3, le=10, allow_inf_nan=False)
    repeat_last_n: Optional[Annotated[int, Field(ge=-1), BeforeValidator(_integral)]] = None  # None: 64
    grammar: Optional[Text] = None  # llama-server: GBNF; "" (its default): none
    json_schema: Optional[dict[str, Any]] = None  # llama-server
    response_format: Optional[ResponseFormat] = None
    n: Optional[PositiveInt] = None  # choices per prompt; None: 1 (the handler caps it at the slots)
    best_of: Optional[PositiveInt] = None  # only equal to n

    @field_validator("n_predict")
    @classmethod
    def _n_predict_not_zero(cls, v: Optional[int]) -> Optional[int]:
        if v == 0:
            raise PydanticCustomError("invalid_n_predict", "n_predict must be -1 (until the end) or at least 1")
        return v

    def _predicted(self) -> Optional[int]:
        """n_predict as a max_tokens: None for -1 (until EOS or the end of the slot's context)."""
        return None if self.n_predict is None or self.n_predict < 0 else self.n_predict

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_unicode(cls, v: Any) -> Any:
        # Checked here so that a bad string gives one error, not one per member of the union.
        for s in [v] if isinstance(v, str) else v if isinstance(v, list) else []:
            if isinstance(s, str):
                _valid_unicode(s)
        return v

    @model_validator(mode="after")
    def _fill_defaults(self):
        if self.temperature is None:
            self.temperature = TEMPERATURE_DEFAULT
        if self.top_p is None:
            self.top_p = 1.0
        if self.top_k is None:
            self.top_k = 0
        if self.sampling_mode is None:
            self.sampling_mode = "rejection"
        if self.stream is None:
            self.stream = False
        if self.cache_prompt is None:
            self.cache_prompt = True
        self.ignore_eos = bool(self.ignore_eos)
        self.return_tokens = bool(self.return_tokens)
        if self.speculative is None:
            self.speculative = SpeculativeOptions()
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        self.stop = [s for s in stops if s]  # an empty stop string would match everywhere: dropped
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# --- /v1/completions -----------------------------------------------------------------------------------------------

_PROMPT_SHAPE = "prompt must be a non-empty string, list of strings, list of token ids, or list of token-id lists"


def _bad_prompt(message: str = _PROMPT_SHAPE, **ctx) -> PydanticCustomError:
    return PydanticCustomError("invalid_prompt", message, ctx or None)


def _check_tokens(ids: list, where: str) -> list[int]:
    if not ids:
        raise _bad_prompt("prompt must not be empty ({where} has no tokens)", where=where)
    ids = [_integral(t) for t in ids]
    for i, t in enumerate(ids):
        if not _is_token(t):
            raise _bad_prompt()
        if t < 0:
            raise _bad_prompt("token ids must be >= 0 (got {t} at {where}[{i}])", t=t, where=where, i=i)
    return ids


class CompletionRequest(_Generation):
    """POST /v1/completions. A list prompt is one batch of prompts: each gets its own choice (``index``)."""

    prompt: Union[
        Annotated[Text, Field(min_length=1)],
        Annotated[list[Annotated[Text, Field(min_length=1)]], Field(min_length=1)],
        Annotated[list[TokenId], Field(min_length=1)],
        Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)],
    ]
    # after validation: the limit, or None (until EOS or the end of the slot) only from n_predict: -1
    max_tokens: Optional[PositiveInt] = COMPLETION_MAX_TOKENS_DEFAULT
    logprobs: Optional[TopN] = None  # N: the chosen token's logprob + top-N
    echo: Optional[bool] = False  # prepend the prompt (and its logprobs) to the text: lm-eval loglikelihood

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        # One clear message instead of one error per member of the union.
        if isinstance(v, str):
            if not v:
                raise _bad_prompt("prompt must not be empty")
            return _valid_unicode(v)
        if not isinstance(v, list) or not v:
            raise _bad_prompt("prompt must not be empty" if isinstance(v, list) else _PROMPT_SHAPE)
        if all(isinstance(x, str) for x in v):
            for i, s in enumerate(v):
                if not s:
                    raise _bad_prompt("prompt must not be empty (prompt[{i}] is an empty string)", i=i)
                _valid_unicode(s)
        elif all(isinstance(x, list) for x in v):
            v = [_check_tokens(ids, f"prompt[{i}]") for i, ids in enumerate(v)]
        else:
            v = _check_tokens(v, "prompt")
        return v

    @model_validator(mode="after")
    def _completion_defaults(self):
        if self.max_tokens is None or "max_tokens" not in self.model_fields_set:
            self.max_tokens = COMPLETION_MAX_TOKENS_DEFAULT if self.n_predict is None else self._predicted()
        if self.echo is None:
            self.echo = False
        return self

    def prompts(self) -> list[Union[str, list[int]]]:
        """The batch of prompts: one string or one list of token ids per choice."""
        p = self.prompt
        if isinstance(p, str) or (p and _is_token(p[0])):
            return [p]
        return list(p)


# --- /v1/chat/completions ------------------------------------------------------------------------------------------


class TextPart(_Body):
    type: Literal["text"]
    text: Text


Content = Union[Text, list[TextPart]]


class _Message(_Body):
    content: Content
    name: Optional[Text] = None
    null_content: ClassVar[bool] = False

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, v: Any) -> Any:
        if v is None:
            if cls.null_content:
                return v
            raise PydanticCustomError("invalid_content", "content must not be null (only assistant content may be)")
        if isinstance(v, str):
            return _valid_unicode(v)
        if not isinstance(v, list):
            raise PydanticCustomError("invalid_content", "content must be a string or a list of text parts")
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise PydanticCustomError(
                    "unsupported", "only text content is supported (got a part of type {kind})", {"kind": repr(kind)}
                )
            if isinstance(part.get("text"), str):
                _valid_unicode(part["text"])
        return v

    def text(self) -> str:
        """The content as one string; text parts are joined with newlines (as vLLM does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)


class SystemMessage(_Message):
    role: Literal["system"]


class DeveloperMessage(_Message):
    role: Literal["developer"]  # OpenAI's newer name for system; mapped to system where the template lacks it


class UserMessage(_Message):
    role: Literal["user"]


class FunctionCall(_Body):
    name: Text
    arguments: Text  # a JSON object as text, as OpenAI sends it


class ToolCallIn(_Body):
    """An earlier turn's call, as the assistant message of that turn carries it."""

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: Optional[Content] = None
    null_content: ClassVar[bool] = True
    tool_calls: Optional[list[ToolCallIn]] = None  # rendered back into the prompt (tools.py)


class ToolMessage(_Message):
    """A tool's result, answering the call ``tool_call_id``."""

    role: Literal["tool"]
    tool_call_id: Text


ChatMessage = Annotated[
    Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")
]

FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function name


class FunctionDef(_Body):
    name: Annotated[Text, Field(pattern=FUNCTION_NAME)]
    description: Optional[Text] = None
    parameters: Optional[dict[str, Any]] = None  # a JSON schema of the arguments (None: any object)
    strict: Optional[bool] = None  # the arguments always follow the schema when a call is forced (tools.py)


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Body):
    name: Text


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_Generation):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    # Either name works; max_completion_tokens wins. After validation max_tokens holds the limit, or None:
    # generate until a stop, EOS or the end of the slot's context (the server computes that bound).
    max_tokens: Optional[PositiveInt] = None
    max_completion_tokens: Optional[PositiveInt] = None
    logprobs: Optional[bool] = False  # the chosen token's logprob
    # + N alternatives. Only with logprobs: true; otherwise ignored (OpenAI refuses that pair; we answer as if
    # top_logprobs were absent, so every request the published schema allows is served).
    top_logprobs: Optional[TopN] = None
    tools: Optional[list[Tool]] = None  # tools.py
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None  # None: auto
    parallel_tool_calls: Optional[bool] = None  # None: true

    @model_validator(mode="after")
    def _chat_defaults(self):
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        elif self.max_tokens is None:
            self.max_tokens = self._predicted()
        if self.logprobs is None:
            self.logprobs = False
        if not self.logprobs:
            self.top_logprobs = None
        return self

    def template_messages(self) -> list[dict]:
        """The conversation as chat templates expect it: ``[{"role": str, "content": str}, ...]``, plus an
        assistant turn's ``tool_calls`` and a tool result's ``tool_call_id`` (OpenAI's shapes)."""
        out = []
        for m in self.messages:
            d = {"role": m.role, "content": m.text()}
            if m.name is not None:
                d["name"] = m.name
            if getattr(m, "tool_calls", None):
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if isinstance(m, ToolMessage):
                d["tool_call_id"] = m.tool_call_id
            out.append(d)
        return out

    def tool_dicts(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def tool_choice_value(self):
        """``tool_choice`` as tools.plan takes it: a string or ``{"function": {"name": ...}}``."""
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedToolChoice) else c


# --- llama-server's native endpoints (native_api.py) ---------------------------------------------------------------


class NativeCompletionRequest(_Generation):
    """POST /completion: llama-server's body. One prompt (a string, tokenized with BOS, or token ids); n_predict
    (default -1: until EOS or the end of the slot) is the limit."""

    prompt: Union[Annotated[Text, Field(min_length=1)], Annotated[list[TokenId], Field(min_length=1)]]
    id_slot: Optional[Int] = -1  # no effect: the engine picks the slot (the prompt cache finds a prefix anywhere)

    @property
    def max_tokens(self) -> Optional[int]:
        return self._predicted()


class NativeCompletionEvent(BaseModel):
    """One streamed event of POST /completion; the last one (stop: true) also has the summary's fields."""

    index: int = 0
    content: str
    tokens: list[int]
    stop: bool
    id_slot: int = -1
    tokens_predicted: int


class ApplyTemplateResponse(BaseModel):
    prompt: str


class ModelControlRequest(_Body):
    model: Text  # a preset name, exactly


class ModelControlResponse(BaseModel):
    success: bool = True


# --- /tokenize, /detokenize ----------------------------------------------------------------------------------------


class TokenizeRequest(_Body):
    content: Text
    add_special: bool = False  # prepend BOS (as llama-server: off by default)
    parse_special: bool = True  # special-token text becomes that token (as llama-server and our completions)
    model: Optional[Text] = None


class TokenizeResponse(BaseModel):
    tokens: list[int]


class DetokenizeRequest(_Body):
    tokens: list[TokenId]
    model: Optional[Text] = None


class DetokenizeResponse(BaseModel):
    content: str


# --- /slots/{id_slot}?action=save|restore|erase (llama-server's slot files) ------------------------------------------

SlotAction = Literal["save", "restore", "erase"]


class SlotActionRequest(_Body):
    filename: Optional[Text] = None  # save and restore: a bare name inside the server's --slot-save-path
    model: Optional[Text] = None


class SlotSaveTimings(BaseModel):
    save_ms: float


class SlotRestoreTimings(BaseModel):
    restore_ms: float


class SlotSaveResponse(BaseModel):
    id_slot: int
    filename: str
    n_saved: int  # tokens of the slot's kept sequence
    n_written: int  # bytes of the file
    timings: SlotSaveTimings


class SlotRestoreResponse(BaseModel):
    id_slot: int
    filename: str
    n_restored: int  # tokens now kept in the slot
    n_read: int  # bytes of the file
    timings: SlotRestoreTimings


class SlotEraseResponse(BaseModel):
    id_slot: int
    n_erased: int  # tokens the slot no longer keeps


SlotActionResponse = Union[SlotSaveResponse, SlotRestoreResponse, SlotEraseResponse]


# --- responses: shared pieces --------------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache, not recomputed


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> "Usage":
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


class Timings(BaseModel):
    """llama-server's ``timings`` object, so existing dashboards work. draft_n: drafted tokens; draft_n_accepted:
    drafted tokens the target accepted (draft_n_accepted / draft_n is the acceptance rate)."""

    cache_n: int = 0  # prompt tokens reused from the cache
    prompt_n: int
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int = 0
    draft_n_accepted: int = 0
    # pydflash's own: the engine steps after prefill (draft_steps of them carried drafts) and where their time went,
    # summed over the call's choices (a step of several slots counts for each): draft = the drafter's forward,
    # verify = the target's, commit = accept/rollback/emit, host = the rest of the step (engine/stats.py)
    steps: int = 0
    draft_steps: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    commit_ms: float = 0.0
    host_ms: float = 0.0

    @classmethod
    def of(cls, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float,
           draft_n: int = 0, draft_n_accepted: int = 0, cache_n: int = 0, **steps) -> "Timings":
        """Rates are 0 when no time was measured (JSON has no infinity); ``steps``: the step fields above."""

        def rate(n: int, ms: float) -> float:
            return n * 1000.0 / ms if ms > 0 else 0.0

        return cls(cache_n=cache_n, prompt_n=prompt_n, prompt_ms=prompt_ms,
                   prompt_per_second=rate(prompt_n, prompt_ms), predicted_n=predicted_n,
                   predicted_ms=predicted_ms, predicted_per_second=rate(predicted_n, predicted_ms),
                   draft_n=draft_n, draft_n_accepted=draft_n_accepted, **steps)


# None in every streamed chunk but the last of a choice; "tool_calls": the answer holds tool calls
FinishReason = Optional[Literal["stop", "length", "tool_calls"]]


def now() -> int:
    """``created``: Unix seconds."""
    return int(time.time())


# --- /v1/completions responses -------------------------------------------------------------------------------------


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy format: parallel lists, one entry per token of ``text``. The first echoed prompt token has
    no logprob (None): nothing precedes it."""

    tokens: list[str]
    token_logprobs: list[Optional[LogProb]]
    top_logprobs: list[Optional[dict[str, LogProb]]]  # token text -> logprob, N alternatives
    text_offset: list[int]  # character offset of each token in the choice's text


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason = None
    logprobs: Optional[CompletionLogprobs] = None
    tokens: Optional[list[int]] = None  # the generated token ids, with return_tokens


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timings: Optional[Timings] = None


class CompletionChunk(BaseModel):
    """One SSE event of a streamed completion. The optional usage chunk has ``choices == []``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    timings: Optional[Timings] = None


# --- /v1/chat/completions responses --------------------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: LogProb
    bytes: Optional[list[int]] = None  # the token's UTF-8 bytes (a token can be part of a character)


class TokenLogprob(BaseModel):
    token: str
    logprob: LogProb
    bytes: Optional[list[int]] = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: Optional[list[TokenLogprob]] = None


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: dict[str, str]  # {"name": ..., "arguments": a JSON object as text}


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCallOut]] = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    finish_reason: FinishReason = None
    logprobs: Optional[ChatLogprobs] = None
    tokens: Optional[list[int]] = None  # the generated token ids, with return_tokens


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Optional[Timings] = None


class ToolCallDelta(BaseModel):
    """A call's first delta has its index, id, type and name (arguments ""), the next ones argument text."""

    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: dict[str, str]


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None  # only in the first chunk
    content: Optional[str] = None
    tool_calls: Optional[list[ToolCallDelta]] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason = None
    logprobs: Optional[ChatLogprobs] = None
    tokens: Optional[list[int]] = None  # this chunk's token ids, with return_tokens


class ChatChunk(BaseModel):
    """One SSE event of a streamed chat completion. The optional usage chunk has ``choices == []``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    timings: Optional[Timings] = None


# --- /v1/models, /health, errors -----------------------------------------------------------------------------------


class ModelMeta(BaseModel):
    """pydflash extension on each model card."""

    resident: bool = False  # loaded in a worker now
    default: bool = False  # the preset that "any" resolves to when nothing is resident
    status: Literal["loaded", "loading", "unloaded"] = "unloaded"  # llama-server's router names (restarting: loading)
    n_ctx: int = 0  # each slot's context (the preset's n_ctx_slot)
    n_slots: int = 0
    drafter: Optional[str] = None  # the DFlash drafter's GGUF; None: plain decoding


class ModelCard(BaseModel):
    id: str  # the preset name
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "pydflash"
    meta: Optional[ModelMeta] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class RouterModelStatus(BaseModel):
    value: Literal["loaded", "loading", "unloaded"]


class RouterModel(BaseModel):
    """One entry of GET /models (llama-server's router mode)."""

    id: str
    object: Literal["model"] = "model"
    path: str  # the target GGUF
    status: RouterModelStatus
    meta: ModelMeta


class RouterModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RouterModel]


class HealthResponse(BaseModel):
    status: Literal["ok", "loading", "error"]  # 200 only with "ok"
    message: Optional[str] = None  # why not ok


class ErrorDetail(BaseModel):
    message: str
    type: str  # invalid_request_error, exceed_context_size_error, not_found_error, ... (see errors.py)
    param: Optional[str] = None  # the offending request field, e.g. "messages[0].content"
    code: Optional[int] = None  # the HTTP status


class ErrorResponse(BaseModel):
    """OpenAI's error envelope, for every 4xx/5xx and for ``data: {"error": ...}`` mid-stream."""

    error: ErrorDetail

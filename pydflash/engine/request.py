"""What a caller submits, and what comes back."""

from __future__ import annotations

import itertools
import math
import numbers
import secrets
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Union

from ..errors import InvalidRequest
from . import controls, schema
from .rejection import drafter_seed
from .stats import Stats

_ids = itertools.count()
SAMPLING_MODES = ("rejection", "match")
# q keeps only the drafter's 256 likeliest tokens (any q keeps the output exact; docs/sampling.md): each block row
# then hands the host 256 probabilities instead of the vocabulary's, and top-p sorts 256 candidates, not 262k
DRAFT_TOP_K = 256
MIN_REPEAT_PENALTY = 1e-3


def _fail(msg: str):
    raise InvalidRequest(msg)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass
class Request:
    """One generation request. Every field is checked on construction (``InvalidRequest``, a ``ValueError``), so
    the API, the CLI and the server refuse bad input before anything is queued.

    Sampling (temperature 0 = greedy, whatever ``sampling_mode`` says). p is the target's distribution after
    this request's top-k, top-p and temperature (in that order, as its backend chain applies them). Both modes
    commit tokens distributed exactly as p; they differ in how many drafts they accept:
    - ``"rejection"`` (the default): the drafter *samples* each draft from q (its own distribution under the
      same transforms); the target accepts draft x with probability min(1, p(x)/q(x)); the first rejection
      commits a sample of norm(max(0, p - q)); if every draft is accepted the bonus is the target's sample
      (``rejection.py``). Accepts as much as the overlap of p and q allows.
    - ``"match"`` (sample-and-match, as llama.cpp): drafts stay the drafter's argmax, the target samples every
      verified position and a draft is accepted iff it equals that sample. Exact for a deterministic drafter
      (draft d is kept with probability p(d)), but it accepts less at temperatures where p is spread out.

    Seeds. Without ``seed`` a request draws a fresh 32-bit seed from the OS (``secrets``), so unseeded requests
    differ across calls and processes. With ``seed``, what is promised:
    - the same request on the same build and engine configuration, with the same batch composition (run
      alone, or next to the same requests admitted in the same order), gives the same output every time;
    - each request's random streams are its own: the backend sampler chains of its slot (the target's, and in
      rejection mode the drafter's, seeded from a mix of ``seed``) and a host stream for the acceptance
      uniforms and recovered tokens, all reset at admission. Other requests never consume them;
    - in match mode, position j of the output uses the j-th draw of the target chain's stream whatever the
      draft length (llama.cpp draws for a verify span from a scratch copy and advances the stream by the
      committed tokens only), so a seeded request gives the same text with and without drafting;
    - NOT promised: the same output next to other requests, on another build or device, or across modes or
      draft lengths in rejection mode (draws there depend on what was drafted). A forward over a different
      batch rounds differently, and a draw that lands within float noise of a CDF boundary then picks a
      neighbouring token, after which the text goes its own way (as in llama.cpp and vLLM).

    Controls (``controls.py`` has the order and the formulas; docs/sampling.md what each does under speculation).
    Each transforms the target's logits and the drafter's alike, at every verified position, given the history up
    to that position (drafts earlier in the block included):
    - ``logit_bias``: {token id: bias} added to the logit; a bias of -100 or below (or -inf) bans the token;
    - ``min_p``: drop tokens below min_p x the likeliest one's probability (0: off; sampling only);
    - ``presence_penalty``, ``frequency_penalty`` (OpenAI's, in [-2, 2]) and ``repeat_penalty`` (llama.cpp's,
      1: off) over the last ``repeat_last_n`` tokens of prompt + output (-1: all of them, 0: off);
    - ``grammar`` (GBNF) or ``json_schema`` (a dict or its JSON text, turned into GBNF): only tokens the grammar
      allows after the output so far can be committed.
    logit_bias and min_p run in the backend sampler chains like top-k; penalties and a grammar depend on the
    path, so such a request is sampled on the host from the full logits rows (``controlled.py``).
    """

    prompt: Union[str, Sequence[int]]
    max_tokens: int = 128
    stop: Sequence[str] = ()
    draft_max: Optional[int] = None  # None: the engine default (the trained block - 1); 0: no drafting
    ignore_eos: bool = False
    add_special: bool = True  # tokenizer BOS handling for string prompts
    # a string prompt's special-token text (Gemma's "<start_of_turn>") becomes that one token, as llama-server's and
    # llama-cpp-python's completions tokenize it; False: it is read as plain characters
    parse_special: bool = True
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: Optional[int] = None  # None: fresh entropy (see the class docstring)
    sampling_mode: str = "rejection"  # or "match" (sample-and-match); ignored at temperature 0
    cache_prompt: bool = True  # reuse a cached prefix of the prompt (and keep this one for later requests)
    # keep the prompt's prefill for the requests that share it while this one runs (the server's n > 1 choices)
    share_prompt: bool = False
    logit_bias: Optional[Mapping[int, float]] = None  # token id -> added to its logit; <= -100: banned
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0  # 1: off
    repeat_last_n: int = 64  # the penalties' window over prompt + output; -1: all, 0: penalties off
    grammar: Optional[str] = None  # GBNF, root rule "root"
    json_schema: Optional[Union[Mapping, str]] = None  # turned into GBNF (schema.py)
    id: int = field(default_factory=lambda: next(_ids))
    _seed: int = field(init=False, repr=False, compare=False, default=0)
    _bias: tuple = field(init=False, repr=False, compare=False, default=())  # sorted (id, bias), bans at -inf
    _gbnf: Optional[str] = field(init=False, repr=False, compare=False, default=None)  # grammar or the schema's

    def __post_init__(self):
        self._check_prompt()
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            _fail(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
            _fail(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if self.draft_max is not None and (not _is_int(self.draft_max) or self.draft_max < 0):
            _fail(f"draft_max must be None or an integer >= 0, got {self.draft_max!r}")
        for name in ("ignore_eos", "add_special", "parse_special", "cache_prompt", "share_prompt"):
            if not isinstance(getattr(self, name), bool):
                _fail(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not _is_real(self.temperature) or not (0.0 <= self.temperature < math.inf):  # also rejects NaN
            _fail(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            _fail(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            _fail(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.sampling_mode not in SAMPLING_MODES:
            _fail(f"sampling_mode must be one of {', '.join(SAMPLING_MODES)}, got {self.sampling_mode!r}")
        if self.seed is not None and not _is_int(self.seed):
            _fail(f"seed must be None or an integer, got {self.seed!r}")
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)  # numpy scalars become Python's
        self.max_tokens, self.top_k = int(self.max_tokens), int(self.top_k)
        self.draft_max = None if self.draft_max is None else int(self.draft_max)
        self._seed = int(self.seed) & 0xFFFFFFFF if self.seed is not None else secrets.randbits(32)
        self._check_controls()

    def _check_controls(self) -> None:
        self._bias = controls.check_logit_bias(self.logit_bias)
        self.min_p = controls.check_range("min_p", self.min_p, 0.0, 1.0)
        self.presence_penalty = controls.check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = controls.check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        # at least 1e-3: dividing a logit by a subnormal penalty overflows it to inf (the server's schema agrees)
        self.repeat_penalty = controls.check_range("repeat_penalty", self.repeat_penalty, MIN_REPEAT_PENALTY, 10.0)
        if not _is_int(self.repeat_last_n) or self.repeat_last_n < -1:
            _fail(f"repeat_last_n must be an integer >= -1 (-1: the whole history, 0: off), got {self.repeat_last_n!r}")
        self.repeat_last_n = int(self.repeat_last_n)
        if self.grammar is not None and self.json_schema is not None:
            _fail("grammar and json_schema exclude each other: give one")
        if self.grammar is not None:
            if not isinstance(self.grammar, str) or not self.grammar.strip():
                _fail(f"grammar must be a non-empty GBNF string, got {self.grammar!r}")
            self._gbnf = self.grammar
        elif self.json_schema is not None:
            self._gbnf = schema.to_gbnf(self.json_schema)
        if self._gbnf is not None and self.ignore_eos:
            _fail("ignore_eos cannot be combined with grammar or json_schema: the grammar decides where output ends")

    @property
    def penalties(self) -> controls.Penalties:
        return controls.Penalties(self.repeat_penalty, self.frequency_penalty, self.presence_penalty,
                                  self.repeat_last_n)

    @property
    def on_host(self) -> bool:
        """Sampled on the host from full logits rows: controls that depend on the path (penalties, a grammar)."""
        return self._gbnf is not None or self.penalties.on

    def _check_prompt(self) -> None:
        """A non-empty str, or a non-empty sequence of integer token ids (stored as a list of int)."""
        p = self.prompt
        if isinstance(p, str):
            if not p:
                _fail("empty prompt")
            return
        if isinstance(p, (bytes, bytearray, memoryview)):
            _fail("a prompt must be a str or a list of token ids, not bytes (decode it first)")
        if not isinstance(p, (list, tuple, range)) and not (hasattr(p, "tolist") and hasattr(p, "dtype")):
            _fail(f"a prompt must be a str or a list of token ids, got {type(p).__name__}")
        if hasattr(p, "tolist"):  # a numpy array
            if getattr(p, "ndim", 1) != 1 or p.dtype.kind not in "iu":
                _fail("a token-id array must be one-dimensional with an integer dtype")
            p = p.tolist()
        bad = next((t for t in p if not _is_int(t)), None)
        if bad is not None:
            _fail(f"token ids must be integers, got {bad!r}")
        if not p:
            _fail("empty prompt")
        neg = next((t for t in p if t < 0), None)
        if neg is not None:
            _fail(f"token id {neg} outside the vocabulary (ids are >= 0)")
        self.prompt = [int(t) for t in p]

    @property
    def sampling(self) -> Optional[tuple]:
        """What the backend sampler chain of this request's sequence must be (hashable, for reuse); None: no
        chain (``on_host``: the host samples from the logits rows)."""
        if self.on_host:
            return None
        if self.temperature == 0.0:
            return ("greedy", self._bias) if self._bias else ("greedy",)
        return ("dist", self.temperature, self.top_k, self.top_p, self.min_p, self._bias, self._seed)

    @property
    def rejection(self) -> bool:
        """Whether drafts are sampled and accepted by rejection sampling (else greedy, or sample-and-match)."""
        return self.temperature > 0.0 and self.sampling_mode == "rejection"

    @property
    def draft_sampling(self) -> Optional[tuple]:
        """The drafter's backend chain for this request: q under the same transforms in rejection mode, else
        its argmax (of the biased logits: a banned token is never drafted); None: sampled on the host."""
        if self.on_host:
            return None
        if not self.rejection:
            return ("greedy", self._bias) if self._bias else ("greedy",)
        top_k = min(self.top_k, DRAFT_TOP_K) if self.top_k else DRAFT_TOP_K
        return ("dist", self.temperature, top_k, self.top_p, self.min_p, self._bias, drafter_seed(self._seed))


@dataclass
class Result:
    request_id: int
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    stats: Stats
    synthetic: bool = False  # synthetic acceptance: the text is NOT valid model output


@dataclass
class Event:
    """One step's output for one request (streaming)."""

    request_id: int
    text: str
    tokens: list[int]
    finished: bool = False
    result: Optional[Result] = None

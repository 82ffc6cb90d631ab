"""The worker's own tokenizer: the preset target's vocabulary, loaded once per worker without its weights.

Prompts are tokenized, and an echoed prompt detokenized, here in the worker, as llama-server does in its HTTP
threads: a request then reaches the engine once (its submit) instead of queueing twice more for a step boundary,
and tokenizing a long prompt never runs inside the engine's step loop, where it would stall every running stream.

The vocabulary is llama.cpp's own (``ModelParams(vocab_only=True)``: the same GGUF, so the same tokens as the engine's
target; about 1 s to load Gemma-3's 262k tokens on a CPU). Tokenizing runs on a thread of the default executor:
``llama_tokenize`` releases the GIL, so a megabyte prompt (about 1 s per MB) does not hold up the event loop that
writes the other streams' frames.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from ..errors import InvalidRequest
from ..native import Model, ModelParams
from .preset import Preset


class Tokenizer:
    def __init__(self, path: str):
        self._vocab = Model(path, ModelParams(vocab_only=True))
        self.n_vocab = self._vocab.n_vocab

    @classmethod
    def for_preset(cls, preset: Preset) -> "Tokenizer":
        return cls(preset.pair_files()[0])

    async def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        return await asyncio.to_thread(self._vocab.tokenize, text, add_special, parse_special)

    def echo_text(self, tokens: Sequence[int]) -> str:
        """A prompt's text as its echo shows it: the tokens' pieces joined, no special-token rendering (as the
        stream's own text is made). Token ids are the engine's to check: an echo follows an accepted request."""
        return self._vocab.detokenize(tokens).decode("utf-8", "replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        """``/detokenize``: llama.cpp's inverse of tokenize; ids outside the vocabulary are the client's error."""
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} outside the vocabulary [0, {self.n_vocab})")
        return self._vocab.detokenize_text(tokens).decode("utf-8", "replace")

    def close(self) -> None:
        self._vocab.close()

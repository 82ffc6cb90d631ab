"""A GGUF's token pieces as text, read with gguf-py: detokenizing where llama.cpp may not be loaded.

The trainer holds the PyTorch target, and torch with our CUDA libllama in one process aborts (scripts/dev/remote.sh),
so the trainer cannot ask llama.cpp to detokenize; ``holdout.py`` only needs the prompt's words, which the pieces
give: SentencePiece's "▁" is a space, ``<0xNN>`` byte pieces are bytes, control tokens keep their names (holdout's
normalization drops Gemma's turn markup).
"""

from __future__ import annotations

import re
from typing import Sequence

_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Pieces:
    def __init__(self, gguf_path: str):
        import gguf

        field = gguf.GGUFReader(gguf_path).fields["tokenizer.ggml.tokens"]
        self.pieces: list[bytes] = []
        for i in field.data:
            piece = bytes(field.parts[i]).decode("utf-8", "replace")
            m = _BYTE.fullmatch(piece)
            self.pieces.append(bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode())

    def text(self, ids: Sequence[int]) -> str:
        return b"".join(self.pieces[int(t)] for t in ids).decode("utf-8", "replace")

"""A tiny SentencePiece-style ("llama") vocabulary that llama.cpp can load.

Every byte sequence is representable: characters without a piece fall back to the
byte tokens <0x00>..<0xFF>, so arbitrary UTF-8 round-trips through
llama_tokenize / llama_token_to_piece.

Layout (fixed, independent of the seed, identical in target and drafters):

    0      <unk>    UNKNOWN
    1      <s>      CONTROL   bos
    2      </s>     CONTROL   eos
    3      <pad>    CONTROL   pad
    4      <mask>   CONTROL   DFlash mask token (Gemma drafters also use id 4)
    5..260 <0xNN>   BYTE      byte fallback
    261..  "▁", printable ASCII, then word pieces   NORMAL

Why word pieces are all prefixes of "▁word": llama.cpp's SPM tokenizer only
merges adjacent symbols whose concatenation is itself a token, so a piece is
reachable only if a chain of smaller pieces leads to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

SPACE = "\u2581"  # "▁": SentencePiece's visible space

# gguf TokenType values (llama.h LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6

_WORDS = (
    "the of and to in is it you that he was for on are with as his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which she "
    "do how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water been "
    "call who its now find long down day did get come made may part token draft block"
).split()
_SUFFIXES = ("ing", "ed", "er", "es", "ly", "th", "he", "in", "an", "on", "re", "nd", "at", "en")


@dataclass(frozen=True)
class TinyVocab:
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = 3
    mask_id: int = 4

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


def _word_pieces() -> list[str]:
    pieces: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        if p not in seen:
            seen.add(p)
            pieces.append(p)

    for suffix in _SUFFIXES:
        add(suffix)
    for word in _WORDS:
        full = SPACE + word
        for end in range(2, len(full) + 1):  # "▁t", "▁th", "▁the": a merge chain
            add(full[:end])
    return pieces


def build_vocab() -> TinyVocab:
    tokens = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL]
    scores = [0.0] * len(tokens)

    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(BYTE)
        scores.append(0.0)

    normal = [SPACE] + [chr(c) for c in range(0x21, 0x7F)] + _word_pieces()
    for rank, piece in enumerate(normal):
        tokens.append(piece)
        types.append(NORMAL)
        # SPM merges the highest-scoring bigram first; longer pieces score higher so
        # "▁the" wins over stopping at "▁th".
        scores.append(-1000.0 + 10.0 * len(piece) - rank * 1e-3)

    if len(set(tokens)) != len(tokens):  # llama.cpp asserts id_to_token.size() == token_to_id.size()
        raise RuntimeError("tiny vocab has a duplicate piece")
    return TinyVocab(tuple(tokens), tuple(scores), tuple(types))


def add_vocab(writer: gguf.GGUFWriter, vocab: TinyVocab) -> None:
    """Write the tokenizer.ggml.* keys llama.cpp's SPM loader reads (llama-vocab.cpp load())."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_uint32(gguf.Keys.Tokenizer.MASK_ID, vocab.mask_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def build_padded_vocab(n_vocab: int, mask_id: int, mask_piece: str = "<|MASK|>") -> TinyVocab:
    """The tiny vocabulary padded with synthetic pieces to n_vocab tokens, its mask token at mask_id.

    For random-weight models shaped like a real one (Qwen3's 151,936 tokens, z-lab's mask at 151669): the size sets
    the embedding and head, the part of a step that grows with the vocabulary. Prompts tokenize into the tiny
    vocabulary's pieces (the padding is never merged into: no chain of smaller pieces leads to it), and every id
    detokenizes, so whatever a random model generates prints. Id 4 keeps its "<mask>" piece, and is the mask where
    mask_id is 4 (Gemma's drafters, z-lab's Gemma-4 ones included, use Gemma's own <mask> at 4); else it is not.
    """
    base = build_vocab()
    if mask_id != base.mask_id and not base.n_vocab <= mask_id < n_vocab:
        raise ValueError(f"mask id {mask_id} must be {base.mask_id} or lie in [{base.n_vocab}, {n_vocab})")
    tokens, scores, types = list(base.tokens), list(base.scores), list(base.types)
    for i in range(base.n_vocab, n_vocab):
        if i == mask_id:
            tokens.append(mask_piece)
            types.append(CONTROL)
        else:
            tokens.append(f"{SPACE}x{i}")  # "▁x<id>": unique, never a prefix chain of the word pieces
            types.append(NORMAL)
        scores.append(-2000.0)  # below every real piece: never preferred in a merge
    if len(set(tokens)) != len(tokens):
        raise RuntimeError("padded vocab has a duplicate piece")
    return TinyVocab(tuple(tokens), tuple(scores), tuple(types), mask_id=mask_id)

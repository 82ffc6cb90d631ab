"""Keep evaluation and benchmark prompts out of training data, by hash.

Protected texts: the frozen evaluation set (``eval_fresh_v1.jsonl``), the benchmark's frozen prompts
(``scripts/bench/prompts_fresh_v1.jsonl``, ``scripts/bench/chat_fresh_v1.json``: its system prompt and every user
turn) and the older suite's own texts (``eval_suite.texts()``). A training row is dropped when its prompt text

- contains a protected text: every protected text of fewer than ``N`` words is hashed whole, and every window of
  that many words of the candidate is looked up;
- holds a near-copy of a longer one: at least ``SHARE`` of the protected text's distinct ``N``-word shingles (or
  ``LONG`` of them, for the long system prompt of the chat benchmark) occur in the candidate (an exact copy has all
  of them; a few edited words leave most);
- or is mostly protected text itself: ``SHARE`` or more of the candidate's own shingles belong to protected texts
  (a training prompt cut out of an evaluation prompt).

Texts are normalized first (NFKC, lower case, Gemma's turn markup dropped, words and punctuation runs split apart),
so spacing, case and the chat wrapper do not hide a copy; shingles of punctuation alone are not counted. Only hashes
of the protected texts' shingles are held, and a check is a set look-up per window of the candidate.

    python -m pydflash.train.holdout --check FILE.jsonl[.gz]   # how many of its prompts a training path would drop
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import re
import sys
import unicodedata
from collections import defaultdict
from typing import Iterable, Optional, Sequence

import numpy as np

N = 8  # words per shingle: long enough that ordinary phrases ("at the end of the day") rarely collide
SHARE = 0.5
LONG = 24  # shingles shared with one long protected text (a ~31-word passage) that drop a row whatever the share
ROOT = pathlib.Path(__file__).resolve().parents[2]
EVAL_FRESH = pathlib.Path(__file__).resolve().parent / "eval_fresh_v1.jsonl"
BENCH_PROMPTS = ROOT / "scripts" / "bench" / "prompts_fresh_v1.jsonl"
BENCH_CHAT = ROOT / "scripts" / "bench" / "chat_fresh_v1.json"

# Gemma's turn markup is the same in every chat prompt: left in, it would make all chat prompts look alike
_MARKUP = re.compile(r"<start_of_turn>(?:user|model|system)?|<end_of_turn>|<bos>|<eos>")
_WORD = re.compile(r"\w+|([^\w\s])\1*")  # a word, or a run of one punctuation character ("------")


def words(text: str) -> list[str]:
    text = unicodedata.normalize("NFKC", _MARKUP.sub("\n", text)).lower()
    return [m.group(0) for m in _WORD.finditer(text)]


def _h(ws: list[str]) -> int:
    # Python's own hash: salted per process, which is all this needs (nothing is stored), and ~10x blake2b's speed
    # (the trainer checks ~80 k committed prompts at every start)
    return hash(tuple(ws))


def shingles(ws: list[str], n: int = N) -> set[int]:
    """Digests of the n-word windows that hold two or more words: windows of punctuation alone (table rules,
    brackets, indentation art) occur in thousands of unrelated texts."""
    is_word = [w[0].isalnum() or w[0] == "_" for w in ws]
    return {_h(ws[i:i + n]) for i in range(len(ws) - n + 1) if sum(is_word[i:i + n]) >= 2}


class Holdout:
    """Protected texts, as hashes; ``hits(text)`` says whether a training prompt must be dropped."""

    def __init__(self, texts: Iterable[str]):
        self.short: dict[str, set[tuple[int, int]]] = defaultdict(set)  # first word -> (words, digest) of short texts
        self.owners: dict[int, list[int]] = defaultdict(list)  # shingle -> the long texts holding it
        self.sizes: list[int] = []  # distinct shingles of each long text
        self.n_texts = 0
        for t in texts:
            ws = words(t)
            if not ws:
                continue
            self.n_texts += 1
            if len(ws) < N:
                self.short[ws[0]].add((len(ws), _h(ws)))
                continue
            sh = shingles(ws)
            for s in sh:
                self.owners[s].append(len(self.sizes))
            self.sizes.append(len(sh))

    def hits(self, text: str) -> bool:
        ws = words(text)
        for i, w in enumerate(ws):  # a short text starts at one of the candidate's words: hash only where one could
            for n, digest in self.short.get(w, ()):
                if _h(ws[i:i + n]) == digest:
                    return True
        sh = shingles(ws) if len(ws) >= N else set()
        if not sh:
            return False
        found: dict[int, int] = defaultdict(int)
        protected = 0
        for s in sh:
            owners = self.owners.get(s)
            if owners:
                protected += 1
                for o in owners:
                    found[o] += 1
        if protected >= SHARE * len(sh):
            return True
        return any(c >= min(SHARE * self.sizes[o], LONG) for o, c in found.items())


def protected_texts() -> list[str]:
    """Every evaluation and benchmark prompt a training path must keep out."""
    from . import eval_suite

    out = [json.loads(line)["text"] for line in EVAL_FRESH.read_text(encoding="utf-8").splitlines() if line.strip()]
    if BENCH_PROMPTS.exists():  # scripts/ is not installed with the package: a wheel protects what it has
        out += [json.loads(line)["prompt"] for line in BENCH_PROMPTS.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    if BENCH_CHAT.exists():
        chat = json.loads(BENCH_CHAT.read_text(encoding="utf-8"))
        out.append(chat["system"])
        out += [t for c in chat["conversations"] for t in c["turns"]]
    return out + eval_suite.texts()


def held_token_rows(rows: Iterable[Sequence[int]], gguf_path: str) -> np.ndarray:
    """For rows of token ids (prompts), whether each must be dropped; detokenized with the GGUF's pieces
    (vocab.py), so this runs where llama.cpp is not loaded (the trainer, the PyTorch pipeline)."""
    from .vocab import Pieces

    pieces, h = Pieces(gguf_path), default()
    return np.asarray([h.hits(pieces.text(r)) for r in rows], dtype=bool)


_DEFAULT: Optional[Holdout] = None


def default() -> Holdout:
    """The Holdout of protected_texts(), built once per process (~0.1 s)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Holdout(protected_texts())
    return _DEFAULT


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", required=True, help="JSONL (or .gz) of {'text': ...} prompts, as corpus.py writes")
    a = ap.parse_args(argv)
    opener = gzip.open if a.check.endswith(".gz") else open
    h = default()
    total = dropped = 0
    with opener(a.check, "rt", encoding="utf-8") as f:
        for line in f:
            total += 1
            dropped += h.hits(json.loads(line)["text"])
    print(json.dumps({"prompts": total, "dropped": dropped, "protected_texts": h.n_texts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

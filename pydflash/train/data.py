"""Offline prompt corpus: text this machine already has, cut into fixed-length token windows.

Recipe (recorded in pydflash/models/MODEL_CARD.md):
- code: Python sources of the standard library and site-packages;
- prose: Markdown/reStructuredText documents, license texts (/usr/share/common-licenses),
  Debian copyright files, and module/function docstrings of the standard library;
- every file is assigned to train or eval by a hash of its path (eval ~ 1 in 40), so no eval
  prompt shares a file with a training prompt;
- a file holding an evaluation or benchmark prompt (``holdout.py``) gives no training prompts: every window of it
  is a substring of it, so dropping the file drops every window that could contain one;
- each prompt is a window of exactly ``prompt_len`` tokens starting at a line start; equal
  lengths let the target generate a whole batch without padding.
Responses are not here: they are the target's own greedy continuations (see generate.py).
"""
from __future__ import annotations

import ast
import glob
import hashlib
import os
import random
import sysconfig

import numpy as np

MAX_FILE_CHARS = 12_000


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="ignore") as f:
            return f.read(MAX_FILE_CHARS * 4)
    except OSError:
        return ""


def code_files() -> list[str]:
    roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    files = []
    for r in sorted(roots):
        files += glob.glob(os.path.join(r, "**", "*.py"), recursive=True)
    return sorted(f for f in files if "/test" not in f and os.path.getsize(f) > 2000)


def _docstrings(path: str) -> str:
    try:
        tree = ast.parse(_read(path))
    except (SyntaxError, ValueError):
        return ""
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node)
            if d and len(d) > 200 and " the " in d:
                docs.append(d)
    return "\n\n".join(docs)


def prose_sources() -> list[tuple[str, str]]:
    """(key, text) pairs; key is a path (docstrings: 'doc:' + path)."""
    out = []
    roots = sorted({"/usr/share/doc", "/usr/lib/python3", sysconfig.get_paths()["stdlib"],
                    sysconfig.get_paths()["purelib"]})
    seen = set()
    paths = []
    for r in roots:
        for ext in ("md", "rst", "txt"):
            paths += glob.glob(os.path.join(r, "**", "*." + ext), recursive=True)
    paths += glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/doc/*/copyright")
    for p in sorted(set(paths)):
        if "/test" in p or not os.path.isfile(p) or os.path.getsize(p) < 1500:
            continue
        t = _read(p)
        h = hashlib.sha1(t[:4000].encode()).hexdigest()
        if h in seen:
            continue
        seen.add(h)
        out.append((p, t))
    stdlib = sysconfig.get_paths()["stdlib"]
    for p in sorted(glob.glob(os.path.join(stdlib, "*.py")) + glob.glob(os.path.join(stdlib, "*", "*.py"))):
        d = _docstrings(p)
        if len(d) > 1500:
            out.append(("doc:" + p, d))
    return out


def is_eval(key: str, every: int = 40) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % every == 0


def windows(ids: list[int], line_starts: list[int], prompt_len: int, n: int, rng: random.Random) -> list[list[int]]:
    cands = [s for s in line_starts if s + prompt_len <= len(ids)]
    rng.shuffle(cands)
    return [ids[s:s + prompt_len] for s in cands[:n]]


def build(tokenizer, bos: int = 2, prompt_len: int = 96, per_file: int = 4, max_files: int = 6000,
          seed: int = 0, log=print) -> dict[str, np.ndarray]:
    """Tokenize the corpus and cut prompts. tokenizer(text) -> list[int] (no BOS).

    Returns int32 arrays train_code, train_prose, eval_code, eval_prose of shape [N, prompt_len];
    each prompt is ``[BOS] + window`` (llama.cpp adds BOS for Gemma too).
    """
    from . import holdout

    rng = random.Random(seed)
    res = {"train_code": [], "train_prose": [], "eval_code": [], "eval_prose": []}
    stats = {k: 0 for k in res}
    stats["held_out"] = 0
    keep_out = holdout.default()
    code = [(f, None) for f in code_files()]
    prose = prose_sources()
    for kind, items in (("code", code), ("prose", prose)):
        rng.shuffle(items)
        for key, text in items[:max_files]:
            text = _read(key) if text is None else text
            text = text[:MAX_FILE_CHARS]
            if len(text) < 800:
                continue
            split = "eval" if is_eval(key) else "train"
            if split == "train" and keep_out.hits(text):
                stats["held_out"] += 1
                continue
            # tokenize line by line so windows can start at line starts
            ids, starts = [], []
            for line in text.splitlines(keepends=True):
                starts.append(len(ids))
                ids += tokenizer(line)
            for w in windows(ids, starts, prompt_len - 1, per_file, rng):
                res[f"{split}_{kind}"].append([bos] + w)
            stats[f"{split}_{kind}"] += 1
    log(f"files per split: {stats}")
    return {k: np.asarray(v, dtype=np.int32).reshape(-1, prompt_len) for k, v in res.items()}

"""What HTTP handlers ask of an engine besides generation, run on its thread: ``await engine.call(op, *args)``.
(Tokenizing is not one of them: the worker has its own tokenizer, ``tokenizer.py``.)

Each is a module-level function of ``(engine, *args)``: in a worker the call crosses to the engine process
(engine_process.py) by reference and its arguments and result by pickle, so no closure, no handler object and no
llama.cpp handle travels. Errors are the engine's typed ones (InvalidRequest and its subclasses: a 400).
"""

from __future__ import annotations

import time
import weakref
from pathlib import Path

from ..engine.scorer import Scorer

# one scoring context per engine, made on first use (on the loop thread), freed with the engine's process
_scorers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def score(engine, tokens: list[int], top_n: int, first: int = 0):
    """Per-token log-probabilities of ``tokens`` from position ``first`` on (scorer.py) and the byte pieces of
    every token they name."""
    scorer = _scorers.get(engine)
    if scorer is None:
        scorer = _scorers[engine] = Scorer(engine.model, engine.config.n_ctx_slot, engine.config.n_threads)
    scores = scorer.score(tokens, top_n, first)
    pieces = {t: engine.model.token_to_piece(t) for s in scores for t in [s.token, *(x for x, _ in s.top)]}
    return scores, pieces


def erase_slot(engine, id_slot: int) -> dict:
    return engine.erase_slot(id_slot)


def slot_file(engine, action: str, id_slot: int, path: Path, filename: str) -> dict:
    """``save`` an idle slot to ``path`` or ``restore`` it from there (slots.py checked the name)."""
    t0 = time.perf_counter()
    if action == "save":
        out = engine.save_slot(id_slot, path)
        ms = (time.perf_counter() - t0) * 1e3
        return {"id_slot": id_slot, "filename": filename, "n_saved": out["n_saved"],
                "n_written": out["n_written"], "timings": {"save_ms": ms}}
    out = engine.restore_slot(id_slot, path)
    ms = (time.perf_counter() - t0) * 1e3
    return {"id_slot": id_slot, "filename": filename, "n_restored": out["n_restored"],
            "n_read": path.stat().st_size, "timings": {"restore_ms": ms}}


def slot_states(engine) -> list[dict]:
    """Each slot as llama-server's GET /slots shows it: whether it runs a request, which one, how far it got."""
    out = []
    for i, s in enumerate(engine.slots):
        busy = s is not None
        out.append({"id": i, "id_task": s.request.id if busy else -1, "is_processing": busy,
                    "n_prompt_tokens": len(s.prompt) if busy else 0, "n_decoded": len(s.generated) if busy else 0,
                    "n_remain": (s.request.max_tokens - len(s.generated)) if busy else -1})
    return out

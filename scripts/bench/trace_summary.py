#!/usr/bin/env python3
"""Summarise a step trace (PYDFLASH_STEP_TRACE, pydflash/engine/trace.py): per number of running slots and kind of
step (``off``: plain without features, ``feat``: plain with features, ``draft``: some slot drafts, ``copy``: copies
alone, engine/copies.py), the count and
the step's seconds (median, mean, p90) with their split, the tokens the steps emitted and their cost a token
(traces that record ``emitted``), for drafting steps the measured over the predicted seconds
(``predicted`` is set for decided drafting steps, not for calibration or probes), per slot count the share of decode
time that drafting cost beyond plain featureless steps and how many step shapes its drafting took (and what a
shape's first runs cost against its later ones), where the wall time went, what the engine did in each 2-second window
of it (drafting or pausing, round by round), and the costliest steps. Reads a trace or a gzipped one.

    .venv/bin/python scripts/bench/trace_summary.py TRACE [--out SUMMARY.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys


def kind(row: dict) -> str:
    """draft: a drafter block went in; copy: only copies (engine/copies.py); else plain, with features or not."""
    if any(row["ks"]):
        return "draft"
    if row.get("copied"):
        return "copy"
    return "feat" if row["features"] else "off"


def ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": round(1e3 * statistics.median(xs), 3), "mean": round(1e3 * statistics.mean(xs), 3),
            "p90": round(1e3 * xs[int(0.9 * (len(xs) - 1))], 3)}


def summarize(rows: list[dict], worst: int = 12) -> dict:
    decode = [r for r in rows if r["n"] and not r["prefilling"]]
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in decode:
        groups.setdefault((r["n"], kind(r)), []).append(r)
    off = {n: statistics.median(r["s"] for r in rs) for (n, k), rs in groups.items() if k == "off"}
    out = []
    for (n, k), rs in sorted(groups.items()):
        g = {"n": n, "kind": k, "steps": len(rs), "ms": ms([r["s"] for r in rs]),
             "split_median_ms": [round(1e3 * statistics.median(x), 3) for x in zip(*[r["split"] for r in rs])],
             "seconds": round(sum(r["s"] for r in rs), 4)}
        if n in off:  # what these steps cost beyond as many plain featureless steps at n: drafting's bill there
            g["excess_over_off_s"] = round(g["seconds"] - len(rs) * off[n], 4)
        ratios = [r["s"] / r["predicted"] for r in rs if r.get("predicted")]
        if ratios:
            g["measured_over_predicted"] = {"steps": len(ratios), "median": round(statistics.median(ratios), 3),
                                            "mean": round(statistics.mean(ratios), 3)}
        if all("emitted" in r for r in rs):  # what the steps were worth: tokens out, and their cost each
            tokens = sum(sum(r["emitted"]) for r in rs)
            g["tokens"] = tokens
            if tokens:
                g["ms_per_token"] = round(1e3 * g["seconds"] / tokens, 4)
        if all("kept" in r for r in rs):  # idle residents' and device entries' cells beside the running requests
            g["kept_cells_median"] = statistics.median(r["kept"][1] + r["kept"][2] for r in rs)
            g["steps_with_residents"] = sum(1 for r in rs if r["kept"][0])
        if k == "draft":
            g["mean_drafts_per_step"] = round(statistics.mean(sum(r["ks"]) for r in rs), 1)
        if k == "copy":
            g["mean_copied_per_step"] = round(statistics.mean(r["copied"] for r in rs), 1)
        out.append(g)
    costly = sorted(decode, key=lambda r: -r["s"])[:worst]
    return {"steps": len(rows), "decode_steps": len(decode), "groups": out, "by_n": by_n(out),
            "draft_shapes": draft_shapes(decode), "stand_in": stand_in(decode), "time": timeline(rows),
            "windows": windows(decode),
            "costliest": [{"n": r["n"], "ks": r["ks"], "features": r["features"], "ms": round(1e3 * r["s"], 2),
                           "split_ms": [round(1e3 * x, 2) for x in r["split"]]} for r in costly]}


def draft_shapes(decode: list[dict], warm: int = 2) -> list[dict]:
    """Per slot count, how many step shapes its drafting and copying steps took (verify tokens, drafter block tokens)
    and what the steps in each shape's first ``warm`` runs cost against the later ones: a GPU replays a CUDA graph
    only for a shape run before (patches/0007), so a policy whose shapes keep changing runs many steps without one.
    Each early step is also set against the median of its own shape's later runs (``early_over_later``: the warm-up
    factor, free of which shapes happen to be early) and its excess over that median summed (``warmup_excess_s``,
    with ``seconds``, all drafting and copying seconds at that n, beside it); ``shapes_run_once_or_twice`` counts the
    shapes that never ran past their warm-up."""
    out, seen = [], {}
    by: dict[int, list[tuple[tuple, bool, float]]] = {}
    for r in decode:
        if not any(r["ks"]) and not r.get("copied"):
            continue
        shape = (r["n"], r["n"] + sum(r["ks"]) + r.get("copied", 0), sum(k + 1 for k in r["ks"] if k))
        seen[shape] = seen.get(shape, 0) + 1
        by.setdefault(r["n"], []).append((shape, seen[shape] <= warm, r["s"]))
    for n in sorted(by):
        early = [s for _, first, s in by[n] if first]
        later = [s for _, first, s in by[n] if not first]
        row = {"n": n, "steps": len(by[n]), "shapes": sum(1 for k in seen if k[0] == n),
               "shapes_run_once_or_twice": sum(1 for k, c in seen.items() if k[0] == n and c <= warm),
               f"steps_in_first_{warm}_runs": len(early), "seconds": round(sum(s for *_, s in by[n]), 4)}
        for name, xs in (("early", early), ("later", later)):
            if xs:
                row[f"{name}_ms_median"] = round(1e3 * statistics.median(xs), 3)
        settled: dict[tuple, list[float]] = {}
        for shape, first, s in by[n]:
            if not first:
                settled.setdefault(shape, []).append(s)
        base = {k: statistics.median(v) for k, v in settled.items()}
        paired = [(s, base[shape]) for shape, first, s in by[n] if first and shape in base]
        if paired:
            row["early_over_later"] = {"steps": len(paired),
                                       "median": round(statistics.median(s / b for s, b in paired), 3)}
            row["warmup_excess_s"] = round(sum(s - b for s, b in paired), 4)
        out.append(row)
    return out


def windows(decode: list[dict], width: float = 2.0) -> list[dict]:
    """The decode steps in windows of ``width`` seconds of wall time (traces with start times): per window the
    steps, the median running slots, the share of steps that drafted (a drafter block went in) or copied, and the
    tokens emitted per second of step time. A benchmark's rounds last a few seconds each, so a policy that drafts in
    some rounds and pauses through others shows as windows of one kind, then of the other."""
    timed = [r for r in decode if "t" in r]
    if not timed:
        return []
    by: dict[int, list[dict]] = {}
    for r in timed:
        by.setdefault(int((r["t"] - timed[0]["t"]) // width), []).append(r)
    out = []
    for i, rs in sorted(by.items()):
        row = {"from_s": round(i * width, 1), "steps": len(rs), "n_median": statistics.median(r["n"] for r in rs),
               "drafting_share": round(sum(1 for r in rs if any(r["ks"])) / len(rs), 3),
               "copy_share": round(sum(1 for r in rs if not any(r["ks"]) and r.get("copied")) / len(rs), 3)}
        if all("emitted" in r for r in rs):
            row["tok_per_step_s"] = round(sum(sum(r["emitted"]) for r in rs) / sum(r["s"] for r in rs), 1)
        out.append(row)
    return out


def stand_in(decode: list[dict]) -> dict:
    """Per slot count, the steps the policy drafted in by what the copy stand-in (engine/copies.py, CopyPolicy.first)
    decided: ``copy`` (copies stood in for the drafter), ``check`` (the periodic drafting step), or what held it back
    (``match``: no long match at a slot's text end, ``edge``: copies earning less than blocks, ``wait``: after a
    refused copy, ``history``: none kept, ``irregular``: a probe or calibration). Traces from before the field: {}."""
    out: dict[str, dict[str, int]] = {}
    for r in decode:
        if r.get("first"):
            by = out.setdefault(str(r["n"]), {})
            by[r["first"]] = by.get(r["first"], 0) + 1
    return out


def by_n(groups: list[dict]) -> list[dict]:
    """Per slot count: decode seconds, and the share of them that drafting cost beyond plain featureless steps
    (feature and drafting steps' excess over the median ``off`` step at that n; a paused engine's whole bill)."""
    out = []
    for n in sorted({g["n"] for g in groups}):
        gs = [g for g in groups if g["n"] == n]
        total = sum(g["seconds"] for g in gs)
        row = {"n": n, "steps": sum(g["steps"] for g in gs), "seconds": round(total, 4)}
        if all("excess_over_off_s" in g for g in gs) and total > 0:
            row["drafting_share"] = round(sum(g["excess_over_off_s"] for g in gs if g["kind"] != "off") / total, 4)
        out.append(row)
    return out


def timeline(rows: list[dict], idle: float = 0.1) -> dict | None:
    """Where the wall time went (traces with step start times): in steps, between steps while busy (gaps under
    ``idle`` seconds: the server's own work between engine steps), and idle."""
    timed = sorted((r for r in rows if "t" in r), key=lambda r: r["t"])
    if not timed:
        return None
    gaps = [b["t"] - (a["t"] + a["s"]) for a, b in zip(timed, timed[1:])]
    busy, in_steps = sum(g for g in gaps if 0 < g < idle), sum(r["s"] for r in timed)
    return {"span_s": round(timed[-1]["t"] + timed[-1]["s"] - timed[0]["t"], 3), "in_steps_s": round(in_steps, 3),
            "prefill_steps_s": round(sum(r["s"] for r in timed if r["prefilling"]), 3),
            "between_steps_s": round(busy, 3), "between_steps_share": round(busy / max(busy + in_steps, 1e-9), 4),
            "idle_s": round(sum(g for g in gaps if g >= idle), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    with (gzip.open(a.trace, "rt") if a.trace.endswith(".gz") else open(a.trace)) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    text = json.dumps(summarize(rows), indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

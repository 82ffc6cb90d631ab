#!/usr/bin/env python3
"""Summarise a step trace (PYDFLASH_STEP_TRACE, pydflash/engine/trace.py): per number of running slots and kind of
step (``off``: plain without features, ``feat``: plain with features, ``draft``: some slot drafts), the count and
the step's seconds (median, mean, p90) with their split, for drafting steps the measured over the predicted seconds
(``predicted`` is set for decided drafting steps, not for calibration or probes), and the costliest steps.

    .venv/bin/python scripts/trace_summary.py TRACE [--out SUMMARY.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def kind(row: dict) -> str:
    return "draft" if any(row["ks"]) else ("feat" if row["features"] else "off")


def ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": round(1e3 * statistics.median(xs), 3), "mean": round(1e3 * statistics.mean(xs), 3),
            "p90": round(1e3 * xs[int(0.9 * (len(xs) - 1))], 3)}


def summarize(rows: list[dict], worst: int = 12) -> dict:
    decode = [r for r in rows if r["n"] and not r["prefilling"]]
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in decode:
        groups.setdefault((r["n"], kind(r)), []).append(r)
    out = []
    for (n, k), rs in sorted(groups.items()):
        g = {"n": n, "kind": k, "steps": len(rs), "ms": ms([r["s"] for r in rs]),
             "split_median_ms": [round(1e3 * statistics.median(x), 3) for x in zip(*[r["split"] for r in rs])]}
        ratios = [r["s"] / r["predicted"] for r in rs if r.get("predicted")]
        if ratios:
            g["measured_over_predicted"] = {"steps": len(ratios), "median": round(statistics.median(ratios), 3),
                                            "mean": round(statistics.mean(ratios), 3)}
        if k == "draft":
            g["mean_drafts_per_step"] = round(statistics.mean(sum(r["ks"]) for r in rs), 1)
        out.append(g)
    costly = sorted(decode, key=lambda r: -r["s"])[:worst]
    return {"steps": len(rows), "decode_steps": len(decode), "groups": out,
            "costliest": [{"n": r["n"], "ks": r["ks"], "features": r["features"], "ms": round(1e3 * r["s"], 2),
                           "split_ms": [round(1e3 * x, 2) for x in r["split"]]} for r in costly]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    with open(a.trace) as f:
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

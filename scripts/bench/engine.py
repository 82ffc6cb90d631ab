"""Per-step cost split of pydflash: Gemma-3-270M Q4_K_M target with a random drafter, at synthetic acceptance
lengths 1, 4 and 8, against plain decoding through the same engine; plus adaptive drafting with the useless
drafter (real acceptance ~0). All modes run side by side, interleaved over rounds, in one process, and are
reported as ratios to plain decoding (absolute CPU figures on a shared 2-core machine mean little; absolute
figures count only from the GPU).

    .venv/bin/python scripts/bench/engine.py [--rounds 3] [--tokens 128] [--slots 1] [--ngl 0] \\
        [--out docs/results/2026-11-29-cpu/bench_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from pydflash import api
from pydflash.config import EngineConfig
from pydflash.defaults import SHIPPED_DRAFTER, cache_dir, gemma_target
from pydflash.factory.for_target import write_random_drafter_for
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # scripts/ is not a package
from results import default_out  # noqa: E402

PROMPT = (
    "import json\nimport pathlib\n\n\ndef load_config(path):\n    \"\"\"Read a JSON config file and return it "
    "as a dict, with defaults filled in.\"\"\"\n"
)
MODES = [
    ("plain", dict(draft_max=0)),
    ("synthetic L=1", dict(synth_len=1.0)),
    ("synthetic L=4", dict(synth_len=4.0)),
    ("synthetic L=8", dict(synth_len=8.0)),
    ("adaptive, random drafter", dict(adaptive=True)),
    ("adaptive, synthetic L=8", dict(adaptive=True, synth_len=8.0)),
]


def run_mode(llms, name, n_tokens, n_slots=1):
    """n_slots concurrent copies of the request; tok/s is all generated tokens over the wall time."""
    from pydflash.engine.request import Request

    llm = llms[name]
    eng = llm.engine
    before = (eng.stats.t_draft, eng.stats.t_verify, eng.stats.t_commit, eng.stats.t_host)
    reqs = [Request(PROMPT, max_tokens=n_tokens, ignore_eos=True) for _ in range(n_slots)]
    t0 = time.perf_counter()
    results = llm.generate_many(reqs)
    wall = time.perf_counter() - t0
    steps = max(r.stats.n_steps for r in results)
    after = (eng.stats.t_draft, eng.stats.t_verify, eng.stats.t_commit, eng.stats.t_host)
    prefill = max(r.stats.t_prefill for r in results)
    return {
        "tok_s": sum(r.stats.n_generated for r in results) / (wall - prefill),
        "tau": sum(r.stats.n_generated for r in results) / sum(r.stats.n_steps for r in results),
        "steps": steps,
        "per_step_ms": {k: 1000 * (a - b) / steps
                        for k, a, b in zip(("draft", "verify", "commit", "host"), after, before)},
    }


def reduced_drafter(target, drafter, n):
    """The random drafter with an n-token head: the tokens most frequent in local Python sources."""
    import glob

    from pydflash.compat.reduced_head import choose_tokens, token_counts, write_reduced_head
    from pydflash.native import Model

    out = cache_dir() / "models" / f"gemma3-random-drafter-{n}.gguf"
    if out.exists():
        return out
    model = Model(target)
    files = sorted(glob.glob(f"{sys.base_prefix}/lib/python3*/**/*.py", recursive=True))[:300]
    counts = token_counts(model.tokenize(open(f, errors="ignore").read()[:20000], add_special=False) for f in files)
    model.close()
    return write_reduced_head(drafter, target, choose_tokens(counts, n, always=range(8)), out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=1, help="concurrent requests")
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (-1 = all)")
    ap.add_argument("--reduced-head", type=int, default=32768,
                    help="also run the drafting modes with a reduced drafter head of this many tokens (0 = off)")
    ap.add_argument("--only", default="", help="mode names to run, separated by ';' (plain always runs)")
    ap.add_argument("--out", default=default_out("engine.md"))
    args = ap.parse_args(argv)
    target = gemma_target()
    drafter = write_random_drafter_for(target, cache_dir() / "models" / "gemma3-random-drafter.gguf")
    modes = [(name, kw, drafter) for name, kw in MODES]
    if SHIPPED_DRAFTER.exists():  # real acceptance, not synthetic
        modes += [("trained drafter", {}, SHIPPED_DRAFTER),
                  ("trained drafter, adaptive", dict(adaptive=True), SHIPPED_DRAFTER)]
    if args.reduced_head:
        small = reduced_drafter(target, drafter, args.reduced_head)
        modes += [(f"{name}, {args.reduced_head // 1024}k head", kw, small) for name, kw in MODES[1:]]
    if args.only:
        keep = {"plain", *(m.strip() for m in args.only.split(";"))}
        modes = [m for m in modes if m[0] in keep]
    llms = {}
    for name, kw, dft in modes:
        cfg = EngineConfig(n_ctx_slot=1024, n_threads=args.threads, n_slots=args.slots, n_gpu_layers=args.ngl, **kw)
        llms[name] = api.load(target, None if kw.get("draft_max") == 0 else dft, cfg)
        run_mode(llms, name, 8, args.slots)  # warm-up at the measured shapes: graph allocation, first touch
    rows = {name: [] for name, _, _ in modes}
    for r in range(args.rounds):
        for name, _, _ in modes:
            rows[name].append(run_mode(llms, name, args.tokens, args.slots))
            print(f"round {r} {name}: {rows[name][-1]['tok_s']:.1f} tok/s", file=sys.stderr)
    plain = statistics.median(x["tok_s"] for x in rows["plain"])
    table = []
    for name, _, _ in modes:
        runs = rows[name]
        tok_s = statistics.median(x["tok_s"] for x in runs)
        split = {k: statistics.median(x["per_step_ms"][k] for x in runs) for k in ("draft", "verify", "commit", "host")}
        table.append({"mode": name, "tok_s": round(tok_s, 2), "ratio_vs_plain": round(tok_s / plain, 3),
                      "tau": round(statistics.median(x["tau"] for x in runs), 2),
                      "per_step_ms": {k: round(v, 2) for k, v in split.items()}})
    for llm in llms.values():
        llm.close()
    write_report(pathlib.Path(args.out), table, args)
    print(json.dumps(table, indent=1))


def write_report(out: pathlib.Path, table, args) -> None:
    lines = [
        f"# Cost split: Gemma-3-270M Q4_K_M target, random DFlash drafter ({args.slots} concurrent, ngl {args.ngl})",
        "",
        f"`scripts/bench/engine.py --rounds {args.rounds} --tokens {args.tokens} --threads {args.threads} "
        f"--slots {args.slots} --ngl {args.ngl}`: all modes in one "
        "process, interleaved, median over rounds; ms/step are per engine step (all slots). Synthetic modes force "
        "the mean acceptance length (counting the "
        "bonus) like llama.cpp's `--spec-synth-len`; their text is not valid output. Ratios are to plain decoding "
        "through the same engine in the same run.",
        "",
        "| mode | tau | tok/s | vs plain | draft ms/step | verify ms/step | commit ms/step | host ms/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        s = row["per_step_ms"]
        lines.append(f"| {row['mode']} | {row['tau']} | {row['tok_s']} | {row['ratio_vs_plain']} | {s['draft']} | "
                     f"{s['verify']} | {s['commit']} | {s['host']} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

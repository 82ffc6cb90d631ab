"""pydflash-speculative: DFlash speculative decoding on GGUF models from the command line.

Flags follow llama.cpp's names where they exist. Bad input (paths, an unsupported file, a drafter that does not
match the target, a request that does not fit) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_BAD_INPUT = 2
DEFAULT_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pydflash-speculative", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", help="target GGUF (default: the embedded default pair)")
    p.add_argument("-md", "--model-draft", help="DFlash drafter GGUF")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="prompt text")
    src.add_argument("-f", "--file", help="read the prompt from a file")
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate")
    p.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p sampling (1 = off)")
    p.add_argument("-s", "--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--draft-max", type=int, default=None, help="drafts per step (default: trained block - 1)")
    p.add_argument("--draft-adaptive", action="store_true", help="shrink drafting while it does not pay")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context size of the slot")
    p.add_argument("-t", "--threads", type=int, default=0, help="threads (0 = llama.cpp default)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (-1 = all)")
    p.add_argument("--no-spec", action="store_true", help="plain decoding through the same engine")
    p.add_argument("--spec-synth-len", type=float, default=None,
                   help="benchmarking only: force this mean acceptance length; the text is not valid output")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    return p.parse_args(argv)


def _read_prompt(args) -> str:
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def run(args) -> int:
    from .. import api
    from ..config import EngineConfig
    from ..defaults import default_pair
    from ..engine.request import Request

    if args.model_draft and not args.model:
        raise ValueError("-md needs -m: a drafter is paired with the target it was trained for")
    target, drafter, name = args.model, args.model_draft, None
    if target is None:
        d = default_pair()
        target, drafter, name = d.target, d.drafter, d.name
    if args.no_spec:
        drafter = None
    prompt = _read_prompt(args)
    sampling = dict(max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                    seed=args.seed)
    Request(prompt or "x", **sampling)  # validate the flags before loading any model
    cfg = EngineConfig(
        n_ctx_slot=args.ctx_size, n_threads=args.threads, n_gpu_layers=args.n_gpu_layers,
        draft_max=args.draft_max, adaptive=args.draft_adaptive, synth_len=args.spec_synth_len,
    )
    with api.load(target, drafter, cfg) as llm:
        if args.json:
            res = llm.generate(prompt, **sampling)
            print(json.dumps(_json_report(res, name or str(target)), indent=None))
            return 0
        res = None
        for ev in llm.stream(prompt, **sampling):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            res = ev.result if ev.finished else res
        sys.stdout.write("\n")
        _print_stats(res, name or str(target))
    return 0


def _json_report(res, model: str) -> dict:
    st = res.stats.as_dict()
    return {
        "model": model,
        "text": res.text,
        "finish_reason": res.finish_reason,
        "synthetic": res.synthetic,
        "n_prompt": st["n_prompt"],
        "n_generated": st["n_generated"],
        "n_drafted": st["n_drafted"],
        "n_accepted": st["n_accepted"],
        "accept_rate": st["accept_rate"],
        "mean_accept_len": st["mean_accept_len"],
        "tokens_per_second": st["tokens_per_second"],
        "accept_by_position": st["accept_by_position"],
        "time_s": st["time_s"],
    }


def _print_stats(res, model: str) -> None:
    st = res.stats
    t = st.as_dict()["time_s"]
    lines = [
        f"model:       {model}",
        f"n_prompt:    {st.n_prompt}",
        f"n_generated: {st.n_generated} ({res.finish_reason})",
        f"n_drafted:   {st.n_drafted}",
        f"n_accept:    {st.n_accepted}",
        f"accept:      {100 * st.accept_rate:.1f}%",
        f"tau:         {st.mean_accept_len:.3f} tokens/step (incl. bonus)",
        f"speed:       {st.tokens_per_second:.1f} tok/s",
        f"time (s):    prefill {t['prefill']}  draft {t['draft']}  verify {t['verify']}  commit {t['commit']}  host {t['host']}",
    ]
    if res.synthetic:
        lines.append("NOTE: synthetic acceptance was forced; the text above is NOT valid model output")
    print("\n".join(lines), file=sys.stderr)


def _fail(msg: str) -> int:
    print(f"pydflash-speculative: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verbose:
        import os

        os.environ["PYDFLASH_VERBOSE"] = "1"
    from ..errors import PydflashError

    try:
        return run(args)
    except (PydflashError, ValueError, OSError) as exc:
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

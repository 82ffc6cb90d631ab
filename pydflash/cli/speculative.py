"""pydflash-speculative: DFlash speculative decoding on GGUF models from the command line.

Flags follow llama.cpp's names where they exist. Exit codes: 0 done (also when the reader of stdout goes away,
as in `| head -1`), 2 bad input (paths, an unsupported file, a drafter that does not match the target, a request
that does not fit; one line on stderr, naming the file where one is at fault), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .placement import add_placement_args

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command
PROG = "pydflash-speculative"
DEFAULT_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2 (argparse's own adds the usage block)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.splitlines()[0].split(": ", 1)[1],
                epilog="exit status: 0 done (also when stdout's reader goes away), 2 bad input (one line on stderr), "
                       "130 interrupted")
    p.add_argument("-m", "--model", metavar="TARGET", help="target GGUF (default: the embedded default pair)")
    p.add_argument("-md", "--model-draft", metavar="DRAFTER", help="DFlash drafter GGUF (needs -m)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="prompt text")
    src.add_argument("-f", "--file", help="read the prompt from a UTF-8 file")
    p.add_argument("-n", "--n-predict", metavar="N", type=int, default=128,
                   help="tokens to generate (default 128); -1: until EOS or the end of the context, as llama.cpp")
    p.add_argument("--temp", metavar="T", type=float, default=0.0, help="temperature (0 = greedy)")
    p.add_argument("--top-k", metavar="K", type=int, default=0, help="top-k sampling (0 = off)")
    p.add_argument("--top-p", metavar="P", type=float, default=1.0, help="top-p sampling (1 = off)")
    p.add_argument("-s", "--seed", type=int, default=None, help="sampling seed (default: a fresh one every run)")
    p.add_argument("--sampling-mode", choices=("rejection", "match"), default="rejection",
                   help="with --temp > 0: rejection sampling with the drafter's probabilities (default), or "
                        "sample-and-match (drafts are the drafter's argmax, kept iff equal to the target's sample)")
    ctl = p.add_argument_group("sampling controls (applied to the target and the drafter alike)")
    ctl.add_argument("--min-p", metavar="P", type=float, default=0.0, help="min-p sampling (0 = off)")
    ctl.add_argument("--presence-penalty", metavar="X", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    ctl.add_argument("--frequency-penalty", metavar="X", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    ctl.add_argument("--repeat-penalty", metavar="X", type=float, default=1.0, help="llama.cpp's (1 = off)")
    ctl.add_argument("--repeat-last-n", metavar="N", type=int, default=64,
                     help="the penalties' window over prompt + output (-1 = all, 0 = off)")
    ctl.add_argument("-l", "--logit-bias", metavar="TOKEN(+|-)BIAS", action="append", default=[],
                     help="e.g. 15043+1 or 15043-inf (a bias <= -100 bans the token); repeatable")
    grammar = ctl.add_mutually_exclusive_group()
    grammar.add_argument("--grammar", metavar="GBNF", help="constrain the output to a GBNF grammar")
    grammar.add_argument("--grammar-file", metavar="FILE", help="read the GBNF grammar from a file")
    grammar.add_argument("-j", "--json-schema", metavar="SCHEMA", help="constrain the output to a JSON schema")
    grammar.add_argument("--json-schema-file", metavar="FILE", help="read the JSON schema from a file")
    p.add_argument("--draft-max", metavar="K", type=int, default=None,
                   help="most drafts per step (default: trained block - 1); a fixed block with --no-draft-adaptive")
    # None = not given: adaptive, except under --spec-synth-len, whose forced acceptance assumes a fixed block.
    p.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                   help="where the text repeats itself, verify a continuation copied from it instead of the drafter's "
                        "block when it looks better, or alone where adaptive drafting drafts nothing (default: on; "
                        "--no-lookup: the drafter's blocks only)")
    p.add_argument("--draft-adaptive", action=argparse.BooleanOptionalAction, default=None,
                   help="pick the drafts per step (down to none) by measured acceptance and step cost (default: on)")
    p.add_argument("--allow-scale-mismatch", action="store_true",
                   help="load a drafter whose embedding scale or logit softcap disagrees with the target's")
    p.add_argument("-c", "--ctx-size", metavar="N", type=int, default=4096, help="context size of the slot")
    p.add_argument("-t", "--threads", metavar="N", type=int, default=0, help="threads (0 = llama.cpp default)")
    add_placement_args(p)
    p.add_argument("--no-spec", action="store_true", help="plain decoding through the same engine")
    p.add_argument("--spec-synth-len", metavar="L", type=float, default=None,
                   help="benchmarking only: force this mean acceptance length (a fixed block unless "
                        "--draft-adaptive); the text is not valid output")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


class BadInput(Exception):
    """Input the CLI refuses before any model loads; the message is the one line printed."""


def _read_prompt(args) -> str:
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as exc:
            raise BadInput(f"cannot read prompt file {args.file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise BadInput(f"prompt file {args.file} is not UTF-8 text") from None
        if not prompt:
            raise BadInput(f"prompt file {args.file} is empty")
        return prompt
    if args.prompt == "":
        raise BadInput("the prompt is empty (-p '')")
    return args.prompt if args.prompt is not None else DEFAULT_PROMPT


def _parse_bias(items: list[str]) -> dict[int, float] | None:
    """llama.cpp's -l TOKEN(+|-)BIAS form."""
    out = {}
    for item in items:
        cut = max(item.rfind("+"), item.rfind("-"))
        try:
            if cut <= 0:
                raise ValueError
            out[int(item[:cut])] = float(item[cut:])
        except ValueError:
            raise BadInput(f"--logit-bias {item!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043-inf)") from None
    return out or None


def _read_text(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{flag}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _controls(args) -> dict:
    """The Request fields of the sampling-control flags."""
    grammar = args.grammar if args.grammar is not None else (
        _read_text(args.grammar_file, "--grammar-file") if args.grammar_file else None)
    schema = args.json_schema if args.json_schema is not None else (
        _read_text(args.json_schema_file, "--json-schema-file") if args.json_schema_file else None)
    return dict(min_p=args.min_p, presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                logit_bias=_parse_bias(args.logit_bias), grammar=grammar, json_schema=schema)


def run(args) -> int:
    from ..config import EngineConfig
    from ..engine.request import Request

    # Everything that can be checked without a model is checked first: bad input fails in a blink.
    if args.model_draft and not args.model:
        raise BadInput("-md needs -m: a drafter is paired with the target it was trained for")
    prompt = _read_prompt(args)
    to_context_end = _check_n_predict(args.n_predict)
    # with -n -1 the count is known once the prompt is tokenized (below); 1 stands in for the checks before that
    sampling = dict(max_tokens=1 if to_context_end else args.n_predict, temperature=args.temp, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, sampling_mode=args.sampling_mode, **_controls(args))
    Request(prompt, **sampling)
    adaptive = args.draft_adaptive if args.draft_adaptive is not None else args.spec_synth_len is None
    cfg = EngineConfig(
        n_ctx_slot=args.ctx_size, n_threads=args.threads, n_gpu_layers=gpu_layers(args),
        draft_max=args.draft_max, adaptive=adaptive, synth_len=args.spec_synth_len, lookup=args.lookup,
        rpc=args.rpc if args.rpc is not None else (), rpc_allow_public=args.rpc_allow_public,
    )

    from .. import api
    from ..defaults import default_pair

    target, drafter, name = args.model, args.model_draft, None
    if target is None:
        d = default_pair()
        target, drafter, name = d.target, d.drafter, d.name
    if args.no_spec:
        drafter = None
    with _load(api, target, drafter, cfg, args.allow_scale_mismatch) as llm:
        if to_context_end:
            sampling["max_tokens"] = _context_left(llm, prompt)
        if args.json:
            res = llm.generate(prompt, **sampling)
            mode = args.sampling_mode if args.temp > 0 else "greedy"
            print(json.dumps(_json_report(res, name or str(target), adaptive, mode), indent=None))
            return 0
        res = _stream_text(llm, prompt, sampling)
        _print_stats(res, name or str(target))
    return 0


def _check_n_predict(n: int) -> bool:
    """-n is a count >= 1, or -1 for "until EOS or the end of the context" (True); its errors name the flag, not
    the engine's max_tokens."""
    if n == -1:
        return True
    if n < 1:
        raise BadInput(f"-n/--n-predict must be >= 1, or -1 for until EOS or the end of the context; got {n}")
    return False


def _context_left(llm, prompt: str) -> int:
    """What -n -1 generates at most: the slot's context less the prompt and one draft block (the engine keeps
    room for a block's verify past the last token)."""
    engine = llm.engine
    n_prompt = len(llm.tokenize(prompt))
    left = engine.config.n_ctx_slot - n_prompt - engine.block_size
    if left < 1:
        raise BadInput(f"the prompt ({n_prompt} tokens) + draft block ({engine.block_size}) leaves nothing of the "
                       f"context ({engine.config.n_ctx_slot}) to generate in (raise -c/--ctx-size)")
    return left


def gpu_layers(args) -> int:
    """-ngl as given; without it all layers with --rpc (as llama.cpp's default), else none."""
    if args.n_gpu_layers is not None:
        return args.n_gpu_layers
    return -1 if args.rpc is not None else 0


def _load(api, target, drafter, cfg, allow_scale_mismatch: bool):
    """api.load, with drafter errors phrased for this CLI: they name the file and suggest our own flag."""
    from ..compat.inherit import TransformMismatch
    from ..errors import IncompatibleDrafter

    try:
        return api.load(target, drafter, cfg, allow_scale_mismatch=allow_scale_mismatch)
    except TransformMismatch as exc:
        raise BadInput(f"{exc.fact} (pass --allow-scale-mismatch to use the drafter's value)") from None
    except IncompatibleDrafter as exc:
        msg = str(exc).splitlines()[0]
        raise BadInput(msg if str(drafter) in msg else f"drafter {drafter}: {msg}") from None


def _stream_text(llm, prompt: str, sampling: dict):
    res = None
    # closing(): an interrupted stream is closed (its request cancelled) while the engine is still open.
    with contextlib.closing(llm.stream(prompt, **sampling)) as events:
        try:
            for ev in events:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
                res = ev.result if ev.finished else res
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # leave the shell prompt on a line of its own
            sys.stdout.flush()
            raise
    sys.stdout.write("\n")
    sys.stdout.flush()
    return res


def _json_report(res, model: str, adaptive: bool, sampling_mode: str) -> dict:
    st = res.stats.as_dict()
    return {
        "model": model,
        "text": res.text,
        "finish_reason": res.finish_reason,
        "synthetic": res.synthetic,
        "draft_adaptive": adaptive,
        "n_lookup_steps": st["n_lookup_steps"],  # steps that verified a chain copied from the text (--lookup)
        "sampling_mode": sampling_mode,
        "n_prompt": st["n_prompt"],
        "n_generated": st["n_generated"],
        "n_steps": st["n_steps"],
        "n_draft_steps": res.stats.n_draft_steps,
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
        f"n_drafted:   {st.n_drafted} in {st.n_draft_steps} of {st.n_steps} steps",
        f"n_accept:    {st.n_accepted}",
        f"accept:      {100 * st.accept_rate:.1f}%",
        f"tau:         {st.mean_accept_len:.3f} tokens/step (incl. bonus)",
        f"speed:       {st.tokens_per_second:.1f} tok/s",
        f"time (s):    prefill {t['prefill']}  draft {t['draft']}  verify {t['verify']}  commit {t['commit']}  "
        f"host {t['host']}",
    ]
    if res.synthetic:
        lines.append("NOTE: synthetic acceptance was forced; the text above is NOT valid model output")
    print("\n".join(lines), file=sys.stderr)


def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _reader_gone() -> int:
    """stdout's reader closed the pipe (`| head -1`): stop quietly, like any Unix filter.

    Python ignores SIGPIPE, so the write raised BrokenPipeError instead of killing us. Point stdout and stderr at
    /dev/null so that the flush at exit cannot raise again (the recipe of the `signal` module's docs, "Note on
    SIGPIPE"); the exit status is 0 because nothing went wrong on our side.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    return 0


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        if args.verbose:
            from ..native._lib import set_verbose  # llama.cpp's whole log, its debug lines included

            set_verbose(True)
        from ..errors import ContextOverflow, PydflashError

        try:
            rc = run(args)
            sys.stdout.flush()  # a closed pipe must surface here, not in the interpreter's flush at exit
            return rc
        except BrokenPipeError:  # an OSError, but not bad input
            raise
        except BadInput as exc:
            return _fail(str(exc))
        except ContextOverflow as exc:  # the engine names its own numbers; these are the CLI's names for them
            return _fail(f"{exc} (raise -c/--ctx-size or lower -n/--n-predict)")
        except (PydflashError, ValueError, OSError) as exc:
            return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())

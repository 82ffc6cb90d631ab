"""pydflash-convert-drafter DRAFTER_DIR --target TARGET.gguf -o OUT.gguf [--outtype auto|f32|f16|bf16]
                         [--quantize TYPE] [--head-ids FILE [--head-type T] [--d2t-type I32|I64]] [--dry-run]

Converts a z-lab DFlash checkpoint (config.json + safetensors, downloaded beforehand: this fetches nothing) into a
drafter GGUF for TARGET.gguf. Exit codes: 0 written (or, with --dry-run, would be); 2 bad input or a drafter that
does not fit the target, with one line on stderr. Argument parsing only; the work is
pydflash.tools.convert_drafter.convert_drafter.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydflash.compat.reduced_head import D2T_TYPES, HEAD_TYPES
from pydflash.compat.zlab_gguf import OUTTYPES
from pydflash.errors import PydflashError

PROG = "pydflash-convert-drafter"
QUANT_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_S")  # pydflash.native.quantize.FTYPES' quantized ones


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2 (argparse adds a usage block)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Convert a z-lab DFlash drafter checkpoint into a GGUF for a target GGUF.")
    p.add_argument("drafter_dir", type=Path, help="folder with config.json and *.safetensors (z-lab layout)")
    p.add_argument("--target", type=Path, required=True, help="the target GGUF the drafter will run with")
    p.add_argument("-o", "--out", type=Path, help="the drafter GGUF to write (required unless --dry-run)")
    p.add_argument("--outtype", choices=("auto", *OUTTYPES), default="auto",
                   help="type of the matrices (default auto: the checkpoint's own; norms stay F32)")
    p.add_argument("--quantize", choices=QUANT_TYPES, help="quantize every matrix but fc with llama.cpp")
    p.add_argument("--head-ids", type=Path, metavar="FILE",
                   help="target token ids (whitespace-separated) for a reduced lm_head of the drafter's own")
    p.add_argument("--head-type", choices=sorted(HEAD_TYPES), default="Q8_0", help="type of the reduced head")
    p.add_argument("--d2t-type", choices=sorted(D2T_TYPES), default="I32",
                   help="I32: pydflash's patched llama.cpp picks over the reduced head; I64: upstream llama.cpp")
    p.add_argument("--dry-run", action="store_true", help="check everything and print the summary; write nothing")
    return p


def _head_ids(path: Path | None) -> list[int] | None:
    if path is None:
        return None
    try:
        return [int(tok) for tok in path.read_text().split()]
    except (OSError, ValueError) as exc:
        raise ValueError(f"--head-ids {path}: {exc}") from exc


def _summary(res) -> str:
    c = res.config
    return (f"{res.out or '(dry run)'}: {c.n_layer} layers x {c.n_embd} wide, {res.n_tensors} tensors, "
            f"{res.n_params / 1e6:.1f} M parameters ({res.nbytes / 2**20:.1f} MiB as converted; fc "
            f"{res.fc_params / 1e6:.1f} M), block_size {c.block_size}, mask {c.mask_token_id}, "
            f"target layer inputs {list(c.layer_inputs)}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is None and not args.dry_run:
        print(f"{PROG}: error: -o/--out is required (or pass --dry-run)", file=sys.stderr)
        return 2
    from pydflash.tools.convert_drafter import convert_drafter

    quiet = logging.getLogger("pydflash")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the caveats come back in the result and are printed once, below
    try:
        res = convert_drafter(args.drafter_dir, args.target, args.out, outtype=args.outtype, quantize=args.quantize,
                              head_ids=_head_ids(args.head_ids), head_type=args.head_type, d2t_type=args.d2t_type,
                              dry_run=args.dry_run)
    except (PydflashError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        quiet.setLevel(level)  # main() may run inside a larger program (or a test session)
    for line in res.caveats:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    print(_summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

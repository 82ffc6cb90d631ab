"""pydflash-make-tiny-models OUT_DIR [--arch A ...] [--seed N] [--drafter-layers N] [--dtype f32|f16]
                          [--embedding-scale-key X] [--tied-output]

Writes OUT_DIR/<arch>/ for each arch (default: all). Argument parsing only; the work is
pydflash.factory.write_tiny_pair.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .pair import write_tiny_pair
from .targets import ALL_ARCHS, ARCHS
from .weights import DTYPES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pydflash-make-tiny-models", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--arch", action="append", choices=ALL_ARCHS,
                   help=f"repeatable; default: {', '.join(ARCHS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drafter-layers", type=int, default=1)
    p.add_argument("--dtype", choices=DTYPES, default="f32")
    p.add_argument("--embedding-scale-key", type=float, default=None,
                   help="write dflash.embedding_scale with this value (default: no key)")
    p.add_argument("--tied-output", action="store_true", help="targets without output.weight (head = token_embd)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # our messages only: gguf-py logs a line per file at INFO on its own loggers
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pydflash").setLevel(logging.INFO)
    for arch in args.arch or ARCHS:
        pair = write_tiny_pair(args.out_dir / arch, arch=arch, seed=args.seed, drafter_layers=args.drafter_layers,
                               dtype=args.dtype, embedding_scale_key=args.embedding_scale_key,
                               tied_output=args.tied_output)
        print(f"{arch}: target={pair.target} drafter={pair.drafter} mask={pair.mask_token_id} "
              f"target_layer_ids={list(pair.target_layer_ids)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

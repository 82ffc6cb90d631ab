"""pydflash-compare-weights SOURCE GGUF [--json] [--tolerance-file F] [--only PATTERN]

Exit codes: 0 inventory matches and nothing flagged, 1 something is, 2 bad input.
"""
from __future__ import annotations

import argparse
import sys

from pydflash.tools.compare import BadInput, compare, render_table, to_json


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2 (argparse adds a usage block)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pydflash-compare-weights",
        description="Compare HF safetensors weights with a (possibly quantized) GGUF, tensor by tensor.")
    p.add_argument("source", help="a .safetensors file, a model.safetensors.index.json, or a directory")
    p.add_argument("gguf", help="the GGUF to check")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--tolerance-file", metavar="F", help="JSON object: GGUF type -> max relative RMS error")
    p.add_argument("--only", metavar="PATTERN",
                   help="compare only tensors whose HF or GGUF name matches (glob; plain text = substring); "
                        "a pattern that matches nothing is bad input (exit 2)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = compare(args.source, args.gguf, only=args.only, tolerance_file=args.tolerance_file)
    except BadInput as e:
        print(f"pydflash-compare-weights: error: {e}", file=sys.stderr)
        return 2
    print(to_json(report) if args.json else render_table(report))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Thin wrapper around pydflash.factory.cli (same as the pydflash-make-tiny-models console script)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pydflash.factory.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

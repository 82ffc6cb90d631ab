"""Where a benchmark run writes by default: ``docs/results/<date>-<machine>/``, one folder per day and machine.

The machine is ``$PYDFLASH_MACHINE`` (for example ``h200`` or ``cpu``), else ``local``: name the folder for what ran
the benchmark before committing it. Earlier runs are never overwritten by a default path, since each day gets its own
folder and a run that repeats a name on the same day is the newer measurement of the same thing.
"""
from __future__ import annotations

import datetime
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def results_dir() -> pathlib.Path:
    machine = os.environ.get("PYDFLASH_MACHINE", "local")
    return REPO / "docs" / "results" / f"{datetime.date.today().isoformat()}-{machine}"


def default_out(name: str) -> str:
    """The default ``--out`` of a benchmark: NAME inside today's results folder (created when written)."""
    return str(results_dir() / name)

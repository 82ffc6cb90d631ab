"""Loading a script of scripts/bench or scripts/dev (not packages) in a test."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_bench(script: str, module: str | None = None, register: bool = False, folder: str = "bench") -> ModuleType:
    """scripts/<folder>/<script>.py as a module named ``module`` (default: the script's name). register: put it in
    sys.modules first, for a script whose dataclasses look their module up there or whose imports should find it."""
    name = module or script
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / folder / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

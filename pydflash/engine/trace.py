"""An opt-in record of every step, one JSON line each, for reading what adaptive drafting saw on a machine.

``PYDFLASH_STEP_TRACE=PATH`` makes each engine append to PATH (each engine process to PATH.<pid>): the step's start
(``time.perf_counter``, so that the time between steps shows too), running and prefilling slots, verify and drafter
block tokens, whether features were extracted, the step's measured seconds and their split, what the policy
predicted for it, and what the prompt cache kept beside the running requests at the step's end (``kept``: idle
residents, their cells, device-entry cells no slot shares). Off by default: a line (written at once, so that a
server ended by a signal loses none) costs ~10-20 us.
"""

from __future__ import annotations

import json
import os
from typing import Optional


class StepTrace:
    def __init__(self, path: str):
        self._f = open(f"{path}.{os.getpid()}", "a", buffering=1)  # by line: a server may end by a signal

    @staticmethod
    def from_env() -> Optional["StepTrace"]:
        path = os.environ.get("PYDFLASH_STEP_TRACE")
        return StepTrace(path) if path else None

    def write(self, **fields) -> None:
        self._f.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._f.close()

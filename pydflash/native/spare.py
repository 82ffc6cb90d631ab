"""Whether a DFlash drafter's context gets a spare scheduler (patches/0012).

llama.cpp keeps one allocated graph per context. A drafting step runs two batch kinds on the drafter's context, one
after the other: the feature injection (rows without outputs) and the block (outputs). Each rebuilt and reallocated
the other's graph every step; on Gemma-3-270M on an H200 the drafter's part of a drafting step took 1.26 ms at one
slot against 0.47-0.50 ms for its block alone. With a second scheduler each kind keeps its graph allocated: through
pydflash-server on an H100 at one client, 0.50 ms against 0.64 ms without (docs/benchmarks.md, eighteenth session).

Only the drafter's context gets one: its two kinds alternate every drafting step, while the target's batches nearly
all have outputs (a prompt chunk without one is rare), and a spare's buffers grow to whatever graphs it is given,
which for a target would be up to a second copy of its compute buffer. ``PYDFLASH_SPARE_SCHED`` is the user's say:
``0`` turns the drafter's off; ``1`` turns one on for every context of the process, the target's included (the
patch reads it once per process).
"""

from __future__ import annotations

import os
import re

ENV = "PYDFLASH_SPARE_SCHED"


def for_drafter() -> bool:
    """Whether the drafter's context is made with a spare scheduler."""
    value = os.environ.get(ENV)
    if value is None or not value.strip():
        return True
    # read as the patch reads it (C's atoi: leading digits, else 0), so that the two never disagree
    m = re.match(r"\s*[+-]?\d+", value)
    return m is not None and int(m.group()) != 0

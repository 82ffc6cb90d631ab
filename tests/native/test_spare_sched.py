"""pydflash.native.spare: the drafter's context gets patches/0012's spare scheduler unless the user's
PYDFLASH_SPARE_SCHED says 0, read as the patch reads it (C's atoi), so that Python and llama.cpp never disagree.
That the spare keeps the drafter's graphs allocated, and changes no output, is test_native_patches.py's."""

from __future__ import annotations

import pytest

from pydflash.native import spare


@pytest.mark.parametrize("value, on", [
    (None, True), ("", True), ("  ", True),  # unset or blank: the default
    ("0", False), ("00", False), (" 0", False), ("-0", False), ("off", False), ("no", False),  # atoi reads 0
    ("1", True), ("2", True), ("-1", True), ("1x", True), (" +3", True),
])
def test_the_drafters_spare_follows_the_variable_as_the_patch_reads_it(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(spare.ENV, raising=False)
    else:
        monkeypatch.setenv(spare.ENV, value)
    assert spare.for_drafter() is on

"""The prompt cache (pydflash/cache, engine/prefix.py): slot reuse, the device and RAM tiers, sliding windows,
slot files."""

from __future__ import annotations

import pytest

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)


@pytest.fixture(scope="module")
def qwen(tiny):
    """The tiny qwen3 pair, loaded once per module (its cache tests build engines over it)."""
    from pydflash.pair import load_pair

    return load_pair(tiny("qwen3").target, tiny("qwen3").drafter)

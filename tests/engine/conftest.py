"""The engine: the transaction, exactness against plain decoding, sampling and its controls, adaptive drafting."""

from __future__ import annotations

import pytest

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)


@pytest.fixture(scope="module")
def pair(tiny):
    """The tiny qwen3 pair's files (a module may override it with another arch)."""
    return tiny("qwen3")

"""pydflash-server through a real uvicorn and the openai client: handlers, router, workers, faults, Ray Serve."""

from __future__ import annotations

import pytest

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)


@pytest.fixture(scope="module")
def pair(tiny):
    """The tiny gemma3 pair's files: a Gemma target, so the server's Gemma paths (chat format, SWA) are exercised."""
    return tiny("gemma3")

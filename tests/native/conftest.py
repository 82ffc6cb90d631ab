"""The ctypes layer and our llama.cpp patches, against the real library."""

from __future__ import annotations

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)

"""The command-line tools, the benchmarks' bookkeeping, the README and the import graph."""

from __future__ import annotations

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)

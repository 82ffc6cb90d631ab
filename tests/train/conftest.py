"""The drafter's data pipeline, trainer, evaluation sets and the shipped drafter."""

from __future__ import annotations

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)

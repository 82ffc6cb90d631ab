"""Pairs and model families: pairing checks, Gemma transforms, fork-era and z-lab layouts, the factory's writers."""

from __future__ import annotations

from tests.helpers.folders import mark_folder


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__)

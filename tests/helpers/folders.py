"""Each test folder's conftest marks its own tests with the folder's name, so ``pytest -m server`` (or ``-m "not
native"``) selects by area without a list of files to keep up to date."""

from __future__ import annotations

import pathlib

import pytest


def mark_folder(items: list[pytest.Item], conftest_file: str) -> None:
    """Add the marker named after the folder of ``conftest_file`` to every collected item below that folder."""
    folder = pathlib.Path(conftest_file).resolve().parent
    marker = getattr(pytest.mark, folder.name)
    for item in items:
        if folder in pathlib.Path(item.path).resolve().parents:
            item.add_marker(marker)

"""Shared fixtures. Tiny models come from the project's own factory, cached per session; the real Gemma-3-270M
target (marker ``real_model``) is assembled from its PyPI package by setup."""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    """tiny(arch) -> TinyPair, written once per session and arch."""
    from pydflash.factory import write_tiny_pair

    cache = {}

    def get(arch: str = "qwen3", **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in cache:
            name = arch + "".join(f"-{k}{v}" for k, v in sorted(kw.items()))
            cache[key] = write_tiny_pair(tiny_dir / name, arch=arch, seed=0, **kw)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def gemma_path():
    from pydflash.defaults import gemma_target

    return gemma_target()

"""Prompt-cache building blocks without a model: the hash chain, the RAM cache's LRU and lookup, the slot file."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash.cache import blocks, slotfile
from pydflash.cache.ram import RamCache
from pydflash.cache.snapshot import Checkpoint, Features, Snapshot
from pydflash.errors import CacheFileError, InvalidRequest

SEED = blocks.salt("target-digest", "drafter-digest")
DIGESTS = ("target-digest", "drafter-digest")


def snap(tokens, nbytes=1000, ckpts=()):
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    n = len(tokens)
    feats = Features(drafter_base=0, drafter_len=n - 2, rows=rows, positions=np.array([n - 2, n - 1], np.int32))
    return Snapshot(np.asarray(tokens, np.int32), feats, swa_min=3, checkpoints=list(ckpts),
                    target=bytes(range(256)) * (nbytes // 256), drafter=b"drafter-state")


def test_chain_is_a_prefix_hash_salted_by_the_pair():
    a = blocks.chain(list(range(100)), SEED, 32)
    b = blocks.chain(list(range(96)) + [7, 7, 7, 7], SEED, 32)
    assert len(a) == 3 and a == b  # the 4 trailing tokens are not a full block
    c = blocks.chain([0] + list(range(1, 100)), SEED, 32)
    assert c == a
    d = blocks.chain([1] + list(range(1, 100)), SEED, 32)
    assert all(x != y for x, y in zip(a, d))  # a change in block 0 changes every later hash
    other = blocks.chain(list(range(100)), blocks.salt("target-digest", "another-drafter"), 32)
    assert not set(other) & set(a)  # another model pair never matches
    assert blocks.common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2 and blocks.common_prefix([], [1]) == 0


def test_ram_longest_prefix_lru_and_cap():
    s1, s2 = snap(list(range(200)), 4096), snap(list(range(100)) + [9] * 100, 4096)
    cache = RamCache(cap_bytes=2 * s1.nbytes + 10, seed=SEED, block=32)
    assert cache.put(s1)[0] and cache.put(s2)[0]
    key, got, n = cache.candidates(list(range(150)) + [5] * 10, limit=159)[0]
    assert got is s1 and n == 150  # runs into the partial block past the last shared full block
    key2, got2, n2 = cache.candidates(list(range(100)) + [9] * 50, limit=140)[0]
    assert got2 is s2 and n2 == 140  # capped by limit
    assert cache.candidates([5] * 64, limit=63) == []
    cache.hit(key)  # s1 most recently used: s2 goes first
    s3 = snap([3] * 120, 4096)
    assert cache.put(s3)[0]
    assert cache.evictions == 1 and got2 not in cache.entries.values() and s1 in cache.entries.values()
    assert cache.bytes == s1.nbytes + s3.nbytes <= cache.cap
    assert cache.candidates(list(range(100)) + [9] * 50, 140)[0][1] is s1  # s2 evicted; s1 still shares 100 tokens
    assert not cache.put(snap(list(range(64)), 1 << 16))[0]  # larger than the whole cap: not kept
    assert cache.put(snap(list(range(200)), 4096))[0] and len(cache) == 2  # same tokens: replaces s1


def test_slot_file_roundtrip(tmp_path):
    s = snap(list(range(50)), 2048, [Checkpoint(20, 0, b"ckpt-20"), Checkpoint(40, 8, b"ckpt-40")])
    path = tmp_path / "a.slot"
    slotfile.write(path, s, DIGESTS)
    back = slotfile.read(path, DIGESTS)
    assert np.array_equal(back.tokens, s.tokens) and back.target == s.target and back.drafter == s.drafter
    assert back.features.drafter_len == 48 and np.array_equal(back.features.rows, s.features.rows)
    assert [(c.n, c.swa_min, c.target) for c in back.checkpoints] == [(20, 0, b"ckpt-20"), (40, 8, b"ckpt-40")]
    assert back.swa_min == 3


@pytest.mark.parametrize("damage", ["truncated", "flipped", "magic", "foreign", "empty"])
def test_slot_file_refuses_damage(tmp_path, damage):
    data = bytearray(slotfile.dump(snap(list(range(50))), DIGESTS))
    digests = DIGESTS
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 2] ^= 0x40
    elif damage == "magic":
        data[:8] = b"GGUF\0\0\0\0"
    elif damage == "foreign":
        digests = ("target-digest", "another-drafter")
    else:
        data = b""
    with pytest.raises(CacheFileError):
        slotfile.load(bytes(data), digests)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".hidden", "a\0b", "", "a\\b", "x..y"])
def test_slot_file_names(tmp_path, name):
    with pytest.raises(CacheFileError) as e:
        slotfile.safe_path(tmp_path, name)
    assert isinstance(e.value, InvalidRequest)  # a 400 for the server
    assert slotfile.safe_path(tmp_path, "chat-1.bin") == tmp_path / "chat-1.bin"

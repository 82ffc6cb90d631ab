"""The on-disk slot format (llama-server's /slots/{id}?action=save|restore, --slot-save-path).

    magic  b"PYDFSLOT"        8 bytes
    version                   uint32 LE
    header length             uint32 LE
    header                    JSON: digests, bookkeeping, and the length of every blob in order
    blobs                     tokens (int32 LE), target state, drafter state, pending feature rows (float32),
                              their positions (int32), then each checkpoint's target state
    sha256                    32 bytes, of everything before it

Anything unexpected (name, magic, version, length, checksum, digests) raises CacheFileError before any state
reaches a context.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import struct

import numpy as np

from ..errors import CacheFileError
from .snapshot import Checkpoint, Features, Snapshot

MAGIC = b"PYDFSLOT"
VERSION = 1
_FIXED = struct.Struct("<8sII")
MAX_HEADER = 1 << 20


def safe_path(directory: os.PathLike, filename: str) -> pathlib.Path:
    """directory/filename for a client-supplied name: no separators, no '..', no NUL, not hidden."""
    if (not isinstance(filename, str) or not filename or len(filename) > 255 or "/" in filename
            or "\\" in filename or "\0" in filename or ".." in filename or filename.startswith(".")):
        raise CacheFileError(f"invalid slot file name {filename!r}")
    return pathlib.Path(directory) / filename


def dump(snap: Snapshot, digests: tuple[str, str]) -> bytes:
    f = snap.features
    rows = np.ascontiguousarray(f.rows, dtype="<f4")
    blobs = [np.ascontiguousarray(snap.tokens, dtype="<i4").tobytes(), snap.target, snap.drafter, rows.tobytes(),
             np.ascontiguousarray(f.positions, dtype="<i4").tobytes()] + [c.target for c in snap.checkpoints]
    header = {
        "target_digest": digests[0], "drafter_digest": digests[1], "n_tokens": snap.n, "swa_min": snap.swa_min,
        "drafter_base": f.drafter_base, "drafter_len": f.drafter_len, "feature_gap": f.gap,
        "rows_shape": list(rows.shape), "checkpoints": [[c.n, c.swa_min] for c in snap.checkpoints],
        "blobs": [len(b) for b in blobs],
    }
    head = json.dumps(header, sort_keys=True).encode()
    body = _FIXED.pack(MAGIC, VERSION, len(head)) + head + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def load(data: bytes, digests: tuple[str, str]) -> Snapshot:
    """Parse and check a slot file's bytes; CacheFileError for a corrupted, truncated or foreign one."""
    if len(data) < _FIXED.size + 32:
        raise CacheFileError("slot file truncated")
    magic, version, n_head = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise CacheFileError("not a pydflash slot file")
    if version != VERSION:
        raise CacheFileError(f"slot file version {version}, expected {VERSION}")
    body, check = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != check:
        raise CacheFileError("slot file checksum mismatch (corrupted or truncated)")
    if n_head > MAX_HEADER or _FIXED.size + n_head > len(body):
        raise CacheFileError("slot file header length out of range")
    try:
        h = json.loads(body[_FIXED.size : _FIXED.size + n_head])
        sizes = [int(s) for s in h["blobs"]]
        ckpts = [(int(n), int(m)) for n, m in h["checkpoints"]]
        rows_shape = tuple(int(s) for s in h["rows_shape"])
        fields = (str(h["target_digest"]), str(h["drafter_digest"]), int(h["n_tokens"]), int(h["swa_min"]),
                  int(h["drafter_base"]), int(h["drafter_len"]), bool(h["feature_gap"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CacheFileError(f"slot file header unreadable: {exc}") from exc
    tgt_digest, dft_digest, n_tokens, swa_min, base, dlen, gap = fields
    if (tgt_digest, dft_digest) != tuple(digests):
        raise CacheFileError("slot file was saved with another target or drafter")
    if len(sizes) != 5 + len(ckpts) or min(sizes, default=0) < 0 or _FIXED.size + n_head + sum(sizes) != len(body):
        raise CacheFileError("slot file blob sizes do not add up")
    blobs, at = [], _FIXED.size + n_head
    for s in sizes:
        blobs.append(body[at : at + s])
        at += s
    tokens = np.frombuffer(blobs[0], dtype="<i4").astype(np.int32)
    rows = np.frombuffer(blobs[3], dtype="<f4").astype(np.float32)
    positions = np.frombuffer(blobs[4], dtype="<i4").astype(np.int32)
    if len(tokens) != n_tokens or rows.size != int(np.prod(rows_shape)) or len(rows_shape) != 2:
        raise CacheFileError("slot file token or feature counts do not match its header")
    rows = rows.reshape(rows_shape)
    if len(positions) != rows_shape[0] or not 0 <= base <= dlen <= n_tokens:
        raise CacheFileError("slot file feature bookkeeping is inconsistent")
    # pending rows continue the drafter's context position by position (the engine checks only a part's ends)
    if not np.array_equal(positions, np.arange(dlen, dlen + len(positions))) or dlen + len(positions) > n_tokens:
        raise CacheFileError("slot file feature positions do not continue the drafter's context")
    feats = Features(drafter_base=base, drafter_len=dlen, gap=gap, rows=rows, positions=positions)
    checkpoints = [Checkpoint(n, m, bytes(b)) for (n, m), b in zip(ckpts, blobs[5:])]
    return Snapshot(tokens, feats, swa_min=swa_min, checkpoints=checkpoints, target=bytes(blobs[1]),
                    drafter=bytes(blobs[2]))


def write(path: os.PathLike, snap: Snapshot, digests: tuple[str, str]) -> int:
    """Write atomically (a temporary file, then rename); returns the bytes written."""
    path = pathlib.Path(path)
    data = dump(snap, digests)
    tmp = path.with_name(path.name + ".partial")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as exc:
        raise CacheFileError(f"cannot write slot file {path.name}: {exc.strerror}") from exc
    return len(data)


def read(path: os.PathLike, digests: tuple[str, str]) -> Snapshot:
    path = pathlib.Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CacheFileError(f"cannot read slot file {path.name}: {exc.strerror}") from exc
    return load(data, digests)

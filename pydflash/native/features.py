"""Target features read in place: rows of the last batch, left in llama.cpp's per-layer buffers until copied.

A 16-slot drafting step verifies ~144 rows of 5 x 640 floats (1.8 MB) but the drafter takes only the accepted
ones. Copying every row into one array after the forward, then the accepted ones again into the drafter's
injection batch, made two host copies per row, ~0.9 ms a step on the development CPU. ``LayerRows`` names rows
without copying them; the drafter's batch is filled straight from the buffers (``copy_into``), one copy.

The buffers belong to llama.cpp and the context's next forward overwrites them. A read after that raises
(``stale``): whatever the engine still needs then must have been copied out (``array``) before it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import InvariantError


class LayerRows:
    """Rows [start, start + n) of one batch's features: ``views[k]`` is feature layer k's buffer, [rows, n_embd]
    float32 (llama.cpp's, not ours); a row's feature vector is the layers side by side, [n_layers * n_embd], the
    drafter's ``fc`` input order."""

    __slots__ = ("_views", "_epoch", "_now", "start", "n")

    def __init__(self, views: list[np.ndarray], epoch: int, now: Callable[[], int], start: int, n: int):
        self._views = views
        self._epoch = epoch  # the context's forward count when these rows were written
        self._now = now  # its forward count now
        self.start = start
        self.n = n

    def __len__(self) -> int:
        return self.n

    @property
    def width(self) -> int:
        return len(self._views) * self._views[0].shape[1]

    @property
    def stale(self) -> bool:
        return self._now() != self._epoch

    def sub(self, start: int, n: int) -> "LayerRows":
        """Rows [start, start + n) of these (clipped to them)."""
        n = max(0, min(n, self.n - start))
        return LayerRows(self._views, self._epoch, self._now, self.start + start, n)

    def copy_into(self, out: np.ndarray) -> None:
        """out: [n, width] float32 (a slice of a larger C-contiguous batch is fine)."""
        if self.n and self.stale:
            raise InvariantError("target feature rows read after the target's next forward overwrote them")
        e, s = self._views[0].shape[1], self.start
        for k, v in enumerate(self._views):
            out[:, k * e : (k + 1) * e] = v[s : s + self.n]

    def array(self) -> np.ndarray:
        """A copy of its own: [n, width] float32."""
        out = np.empty((self.n, self.width), dtype=np.float32)
        self.copy_into(out)
        return out

"""Incremental detokenization with stop strings.

Tokens arrive in blocks (a whole accepted block per step), so a stop string or a multi-byte UTF-8 character can
span tokens and blocks. We decode with an incremental UTF-8 decoder (incomplete trailing bytes wait for the next
token; invalid bytes become U+FFFD and are still flushed), and hold back any tail of the text that could still
grow into a stop string, so a stop string is never partly emitted.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = ()):
        self.stops = [s for s in stops if s]
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def push(self, piece: bytes) -> str:
        """Add a token's bytes; returns the text that is now safe to emit."""
        if self.stopped:
            return ""
        self.text += self._dec.decode(piece)
        cut = self._find_stop()
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self._holdback())

    def finish(self) -> str:
        """End of generation: flush held-back text and any incomplete bytes. The flush can complete a stop string
        (incomplete bytes become U+FFFD, which a stop may hold): cut there too, so none is ever returned."""
        if not self.stopped:
            self.text += self._dec.decode(b"", final=True)
            cut = self._find_stop()
            if cut is not None:
                self.text, self.stopped = self.text[:cut], True
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out

    def _find_stop(self):
        if not self.stops:
            return None
        # a new stop can only end in the not-yet-emitted part, so search from just before it
        start = max(0, self.emitted - max(len(s) for s in self.stops))
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _holdback(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

"""Generated ids to text, incrementally, with stop strings (pure given the tokenizer).

The whole reply is decoded again after each token (replies are short; this is simpler and exact
where byte-level tokens split a UTF-8 character). Text that may still change is held back from a
stream: a trailing partial character (U+FFFD) and, while stop strings are set, the last
`len(longest stop) - 1` characters, which could be the start of a stop string. When a stop string
appears, the reply ends just before it (vLLM's default: the stop string is not in the output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextTracker:
    """The visible text of one generated sequence, and the part of it not yet streamed."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""
        self.emitted = ""
        self.stopped_by: str | None = None

    def update(self, ids: Sequence[int]) -> str | None:
        """Decode `ids` (all generated so far); returns the stop string it now contains, if any."""
        text = self._tokenizer.decode(list(ids), skip_special_tokens=True)
        earliest: tuple[int, str] | None = None
        for stop in self._stop:
            at = text.find(stop)
            if at >= 0 and (earliest is None or at < earliest[0]):
                earliest = (at, stop)
        if earliest is None:
            self.text = text
        else:
            self.text, self.stopped_by = text[: earliest[0]], earliest[1]
        return self.stopped_by

    def delta(self, *, final: bool) -> str:
        """The text to stream now (empty while it may still change); `final` releases everything."""
        visible = self.text
        if not final:
            visible = visible.rstrip("\ufffd")
            if self._hold:
                visible = visible[: max(len(visible) - self._hold, 0)]
        if not visible.startswith(self.emitted) or len(visible) <= len(self.emitted):
            return ""
        piece = visible[len(self.emitted) :]
        self.emitted = visible
        return piece

"""A Hugging Face `tokenizer.json` read with `tokenizers` (fast; no `transformers` import in the
gateway): the redaction policy's placeholder tokens and the dashboard's token texts both use it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keraunos._settings import ConfigError


class TokenizerFile:
    """A `tokenizer.json` (or a directory holding one); `purpose` names it in a load error."""

    def __init__(self, path: Path, *, purpose: str) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises its own Exception subclass for any bad file
            raise ConfigError(f"cannot load the {purpose} {file}: {exc}") from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens included (a viewer or a redaction wants to see them)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of `text` (no special tokens added) and each id's (start, end) in `text`."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return list(encoding.ids), [tuple(o) for o in encoding.offsets]  # type: ignore[misc]

"""The tokenizer the dashboard decodes token ids with (`--ui-tokenizer`): a `tokenizer.json`.

Read with `tokenizers` (fast; no `transformers` import in the gateway)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from keraunos._settings import ConfigError


class UiTokenizer:
    """Decodes ids to text, special tokens included (a viewer wants to see them)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        file = path / "tokenizer.json" if path.is_dir() else path
        try:
            self._tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises its own Exception subclass for any bad file
            raise ConfigError(f"cannot load the dashboard's tokenizer {file}: {exc}") from None

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

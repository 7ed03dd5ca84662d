"""`tokens: placeholder`: a redacted span's token ids replaced by the placeholder's own ids (pure;
the tokenizer is a `keraunos._tokenizer_file.TokenizerFile` or any `TokenCodec`).

A call's ids are decoded to text, the secrets found in the call's fields are looked up in that
text, and the tokens covering each occurrence (found by the offsets of re-encoding the decoded
text) are replaced by the ids of the same text with the secret replaced by its placeholder. This
holds only where re-encoding gives the call's ids back (an engine may sample a tokenisation the
tokenizer would not make) and where afterwards the decoded ids hold no secret and no rule matches
them; anywhere else `replace_spans` answers None and the call is made untrainable instead. So the
stored ids never decode to a secret either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class TokenCodec(Protocol):
    """What placeholder redaction needs of a tokenizer."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens included."""
        ...

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of `text` (no special tokens added) and each id's (start, end) in `text`."""
        ...


@dataclass(frozen=True, slots=True)
class Replaced:
    """New ids for a sequence, and the positions in them that hold a placeholder's ids."""

    ids: list[int]
    positions: list[int]
    old_len: int
    #: (start, end) in the old ids of each replaced range, and how many ids replaced it.
    ranges: list[tuple[int, int, int]]


def replace_spans(
    codec: TokenCodec,
    ids: Sequence[int],
    secrets: Mapping[str, str],
    still_secret: Callable[[str], bool],
) -> Replaced | None:
    """`ids` with the tokens covering each of `secrets` (secret -> placeholder) replaced by the
    placeholder's ids, or None where that cannot be done faithfully (see the module's docstring).
    `still_secret(text)` says whether any rule still matches `text`."""
    ids = list(ids)
    if not ids:
        return Replaced(ids, [], 0, [])
    text = codec.decode(ids)
    spans = _occurrences(text, secrets)
    if not spans:
        return Replaced(ids, [], len(ids), []) if not still_secret(text) else None
    encoded, offsets = codec.encode(text)
    if encoded != ids:
        return None
    out: list[int] = []
    positions: list[int] = []
    ranges: list[tuple[int, int, int]] = []
    at = 0
    for first, last in _token_ranges(offsets, spans):
        out.extend(ids[at:first])
        start, end = offsets[first][0], offsets[last - 1][1]
        piece, _ = codec.encode(_replace(text[start:end], secrets))
        positions.extend(range(len(out), len(out) + len(piece)))
        ranges.append((first, last, len(piece)))
        out.extend(piece)
        at = last
    out.extend(ids[at:])
    decoded = codec.decode(out)
    if any(secret in decoded for secret in secrets) or still_secret(decoded):
        return None
    return Replaced(out, positions, len(ids), ranges)


def realign(values: list[Any], replaced: Replaced, filler: Callable[[], Any]) -> list[Any] | None:
    """A per-token list (log probs) of the old ids laid out as the new ids are: each replaced range's
    values become `filler()` per new id. None when `values` is not one per old id."""
    if len(values) != replaced.old_len:
        return None
    out: list[Any] = []
    at = 0
    for first, last, n in replaced.ranges:
        out.extend(values[at:first])
        out.extend(filler() for _ in range(n))
        at = last
    out.extend(values[at:])
    return out


def _occurrences(text: str, secrets: Mapping[str, str]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for secret in secrets:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    return sorted(spans)


def _token_ranges(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The token ranges [first, last) covering each character span, overlapping ones merged."""
    ranges: list[tuple[int, int]] = []
    for start, end in spans:
        covering = [i for i, (s, e) in enumerate(offsets) if s < end and e > start]
        if not covering:
            continue
        first, last = covering[0], covering[-1] + 1
        if ranges and first <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(last, ranges[-1][1]))
        else:
            ranges.append((first, last))
    return ranges


def _replace(text: str, secrets: Mapping[str, str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):  # a longer secret first: it may hold a shorter
        text = text.replace(secret, secrets[secret])
    return text

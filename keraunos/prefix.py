"""Whether a model call's prompt extends the previous call's prompt + response, and the suffix (pure NumPy).

An agent's calls usually resend their whole history: call k+1's prompt is call k's prompt, then
call k's response, then a few new ids (tool output, the next user turn, chat-template glue). Three
places live on that fact, and all of them ask this module:

- the ledger stores such a prompt as (shared length, suffix) against the previous call of its
  attempt (`keraunos.ledger.codec`, also when it compacts a call stored in wire form);
- the `format=triplet&delta=1` read sends it as `{prefix_of, prefix_len, suffix}`
  (`keraunos.ledger.codec._triplet_delta`, read back by `keraunos.training._read`);
- the trainer merges such calls into one trajectory row (`keraunos.training.trajectories`).

`shared_prefix` counts the ids a prompt has in common with the previous prompt + response (the
delta forms store any shared length: a rewritten history still shares its system prompt);
`extends` says whether the prompt starts with all of them and where its new ids begin, `suffix`
gives those ids. Neither ever concatenates the previous prompt and response.

One id buffer. A reader of a delta form rebuilds call k+1's prompt from call k's ids and a suffix.
Concatenating a fresh array for every call would copy a rollout's history once per turn; instead
the `Link`s of a chain (each call's prompt and response) lie back to back in one growing `IdBuffer`:
a call that extends the previous call exactly appends only its suffix and its response, and its
prompt is a view of the buffer from offset 0. Such a link says so with its explicit flag,
`Link.extends_previous`, which the readers carry on (the trainer's `Triplet.extends_previous`), so
the merge knows without comparing ids. Nothing looks at array memory (`np.shares_memory`, `.base`,
addresses) to find out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: A token-id sequence: an integer array, or a list where an id needs more than 64 bits.
Ids = np.ndarray | Sequence[int]


def common_prefix(a: Ids, b: Ids) -> int:
    """Length of the longest common prefix of two id sequences (values compared, not dtypes)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        differs = a[:n] != b[:n]
        first = int(differs.argmax())
        return first if differs[first] else n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_prefix(prompt: Ids, prev_prompt: Ids, prev_response: Ids | None = None) -> int:
    """Length of the longest common prefix of `prompt` and `prev_prompt + prev_response`."""
    shared = common_prefix(prompt, prev_prompt)
    if shared == len(prev_prompt) and prev_response is not None and len(prev_response):
        shared += common_prefix(prompt[shared:], prev_response)
    return shared


def extends(prev_prompt: Ids, prev_response: Ids | None, prompt: Ids) -> int | None:
    """`len(prev_prompt) + len(prev_response)` when `prompt` starts with all of both, else None.

    The returned length is where the prompt's new ids (its suffix) begin. A prompt equal to the
    previous prompt + response extends it with an empty suffix.
    """
    base = len(prev_prompt) + (len(prev_response) if prev_response is not None else 0)
    if len(prompt) < base:
        return None
    return base if shared_prefix(prompt, prev_prompt, prev_response) == base else None


def suffix(prev_prompt: Ids, prev_response: Ids | None, prompt: Ids) -> Ids | None:
    """The ids of `prompt` after the previous prompt + response when it extends them, else None."""
    start = extends(prev_prompt, prev_response, prompt)
    return None if start is None else prompt[start:]


class IdBuffer:
    """An append-only buffer of token ids that the prompts and responses of one chain view.

    Written ids never change, so views handed out stay valid; growing moves to a buffer twice the
    size and leaves the old one to the views that still use it. Not thread-safe: one thread reads
    a chain.
    """

    __slots__ = ("ids", "used")

    def __init__(self, dtype: np.dtype[Any], capacity: int) -> None:
        self.ids: np.ndarray = np.empty(max(capacity, 4096), dtype=dtype)
        self.used = 0

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.ids.dtype

    def append(self, ids: Ids) -> np.ndarray:
        """Write `ids` after the last ids; return a read-only view of just them."""
        start, end = self.used, self.used + len(ids)
        if end > len(self.ids):
            grown = np.empty(2 * end, dtype=self.ids.dtype)
            grown[:start] = self.ids[:start]
            self.ids = grown
        self.ids[start:end] = ids
        self.used = end
        return self.view(start, end)

    def view(self, start: int, end: int) -> np.ndarray:
        """A read-only view of ids `start:end`."""
        view = self.ids[start:end]
        view.flags.writeable = False
        return view


@dataclass(frozen=True, slots=True, eq=False)
class Link:
    """One call of a chain: its prompt ids and its response ids (None: the call has none).

    `extends_previous` is the explicit flag that the ids are shared: True exactly when `follow`
    built this prompt in place on the link it was given, so the prompt is a view of that link's
    buffer and starts with all of that link's prompt + response (`extends` holds by construction
    and need not be computed). `buffer`, when not None, holds this link's prompt then its response
    back to back from offset 0; only then can the next call be appended in place. Compare links
    field by field (`==` is identity because of the arrays).
    """

    prompt: np.ndarray
    response: np.ndarray | None = None
    extends_previous: bool = False
    buffer: IdBuffer | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        """Ids in prompt + response."""
        return len(self.prompt) + (len(self.response) if self.response is not None else 0)

    def _appendable(self, dtype: np.dtype[Any]) -> bool:
        """Whether the next ids can be written right after this link's, in its buffer."""
        return self.buffer is not None and self.buffer.used == self.length and self.buffer.dtype == dtype


def start(prompt: Ids, dtype: np.dtype[Any] | type = np.int64) -> Link:
    """The link of a call whose prompt continues nothing: `prompt` copied into a new buffer."""
    buffer = IdBuffer(np.dtype(dtype), 2 * len(prompt))
    return Link(buffer.append(prompt), None, False, buffer)


def follow(prev: Link, shared: int, new: Ids, dtype: np.dtype[Any] | type = np.int64) -> Link:
    """The link of a call whose prompt is the first `shared` ids of `prev`'s prompt + response,
    then `new`; without a response yet (`answer` adds it).

    When `shared` is all of `prev` and `prev`'s ids are the last ones of its buffer (the common
    case), the prompt is appended in place and the link `extends_previous`; otherwise the shared
    ids are copied into a new buffer. Raises `ValueError` when `prev` has fewer than `shared` ids.
    """
    dtype = np.dtype(dtype)
    if not 0 <= shared <= prev.length:
        raise ValueError(f"a prompt cannot share {shared} ids with a call of {prev.length}")
    buffer = prev.buffer
    if shared == prev.length and buffer is not None and prev._appendable(dtype):
        buffer.append(new)
        return Link(buffer.view(0, buffer.used), None, True, buffer)
    buffer = IdBuffer(dtype, 2 * (shared + len(new)))
    from_prompt = min(shared, len(prev.prompt))
    buffer.append(prev.prompt[:from_prompt])
    if shared > from_prompt and prev.response is not None:
        buffer.append(prev.response[: shared - from_prompt])
    buffer.append(new)
    return Link(buffer.view(0, buffer.used), None, False, buffer)


def answer(link: Link, response: np.ndarray) -> Link:
    """`link` with its response: appended to its buffer (a view) when the prompt's ids are the
    buffer's last and the dtypes agree, else kept as the array given, and the link leaves its
    buffer (a next call copies what it shares)."""
    if (
        link.buffer is not None
        and link.buffer.used == len(link.prompt)
        and link.buffer.dtype == response.dtype
    ):
        return Link(link.prompt, link.buffer.append(response), link.extends_previous, link.buffer)
    return Link(link.prompt, response, link.extends_previous, None)

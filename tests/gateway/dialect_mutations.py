"""Mutations of a valid request body, for the dialects' property tests: every path into the body,
and the body with the value at one path replaced or deleted.

A module of its own (not conftest.py) so the test modules import it by a name no other test
directory uses.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

#: Replacement that deletes the value at the path instead.
DELETE = object()


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (keys and indexes) into `value`, the empty one first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def mutated(body: dict[str, Any], path: tuple[Any, ...], replacement: Any) -> dict[str, Any]:
    """A copy of `body` with the value at `path` replaced by `replacement` (or deleted: `DELETE`)."""
    copied = copy.deepcopy(body)
    node: Any = copied
    for step in path[:-1]:
        node = node[step]
    if replacement is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = replacement
    return copied

"""Rollout and attempt ids as file names: readable when they are safe, encoded when they are not.

Whoever enqueues a rollout chooses its id, and an Agent Lightning v1.0 server checks nothing: `..`,
`/etc/x`, an id with a NUL or 10 kB long are all ids. None of them may become a path as it is.
`path_component` keeps an id that is already a plain file name (letters, digits, `_`, `-`, `.`,
not starting with a dot, at most `PLAIN_MAX` characters) and turns any other into a sanitised
prefix of it, `+`, and 16 hex digits of its SHA-256. `+` never occurs in a kept id, so an encoded
name never equals a kept one, and two ids share a name only if their hashes collide. Every name is
one path component of at most `PLAIN_MAX` + 1 bytes, far below the 255 bytes file systems allow.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: Longest id kept as it is (and longest readable prefix of an encoded one).
PLAIN_MAX = 96
#: Hex digits of the id's hash in an encoded name.
HASH_HEX = 16

_PLAIN = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{PLAIN_MAX - 1}}}\Z")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_PREFIX_MAX = PLAIN_MAX - 1 - HASH_HEX


def path_component(value: str) -> str:
    """`value` as one file name: itself when it is a plain name, else `<prefix>+<16 hex>`."""
    if _PLAIN.match(value):
        return value
    digest = hashlib.sha256(value.encode("utf-8", errors="surrogatepass")).hexdigest()[:HASH_HEX]
    prefix = _UNSAFE_RUN.sub("_", value)[:_PREFIX_MAX].lstrip(".")
    return f"{prefix}+{digest}"


def attempt_log_path(log_dir: Path, rollout_id: str, attempt_id: str) -> Path:
    """`LOG_DIR/ROLLOUT/ATTEMPT.log`, each id through `path_component`: always inside `log_dir`."""
    return log_dir / path_component(rollout_id) / f"{path_component(attempt_id)}.log"


def record_stem(rollout_id: str, attempt_id: str) -> str:
    """The file-name stem of an attempt's state record: `ROLLOUT@ATTEMPT` (`@` is in no component)."""
    return f"{path_component(rollout_id)}@{path_component(attempt_id)}"

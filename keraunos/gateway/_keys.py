"""Scoped keys (docs/protocol.md#scoped-keys): the `--keys-file` and the lookup of a presented key.

The file is YAML: `keys: [{name: trainer-1, role: trainer, key_sha256: <hex>}, ...]`. Each entry
names a key, gives it a role (`keraunos.gateway._roles`) and holds the sha256 of the key, so the
file reveals no key; `key: <plaintext>` is accepted too (less safe: whoever reads the file holds
the key). The gateway keeps only the digests and finds a presented key by its digest.

A bad file is a `ConfigError` in one line naming the entry, raised before the gateway serves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from keraunos._settings import ConfigError
from keraunos.gateway._roles import Role
from keraunos.protocol import Id


@dataclass(frozen=True, slots=True)
class ScopedKey:
    """Who a presented key is: the entry's `name` (the audit log's actor `key:NAME`) and its `role`."""

    name: str
    role: Role

    @property
    def actor(self) -> str:
        return f"key:{self.name}"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Id
    role: Role
    key_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    key: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_key(self) -> _Entry:
        if (self.key_sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of key_sha256 (the hex sha256 of the key) and key")
        return self

    def digest(self) -> bytes:
        if self.key_sha256 is not None:
            return bytes.fromhex(self.key_sha256)
        assert self.key is not None
        return key_digest(self.key.encode())


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[dict[str, Any]] = Field(min_length=1)


def key_digest(key: bytes) -> bytes:
    """The sha256 a keys file records for `key` (`key_sha256` is its hex form)."""
    return hashlib.sha256(key).digest()


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The scoped keys of a gateway, by the sha256 digest of each key."""

    by_digest: dict[bytes, ScopedKey]

    def find(self, credentials: Iterable[bytes]) -> ScopedKey | None:
        """The key among `credentials` (the presented header values), or None.

        Looked up by sha256 digest, not compared byte by byte: the lookup's timing can depend only
        on the digest, and a digest tells an attacker nothing about which key would produce it.
        """
        for credential in credentials:
            found = self.by_digest.get(key_digest(credential))
            if found is not None:
                return found
        return None


def load_keys(path: Path, *, server_key: str = "") -> KeyRing:
    """The keys of the file at `path`; `ConfigError` in one line for any problem, naming the entry.

    A key equal to `server_key` is refused: the server key is admin, and one key cannot be two.
    """
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read keys file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise ConfigError(f"keys file {path} is not valid YAML: {first_line}") from None
    try:
        entries = _File.model_validate(data).keys
    except ValidationError as exc:
        raise ConfigError(
            f"keys file {path} must hold a mapping 'keys: [{{name, role, key_sha256}}, ...]' "
            f"with at least one entry: {_first_problem(exc)}"
        ) from None
    server_digest = key_digest(server_key.encode()) if server_key else None
    by_digest: dict[bytes, ScopedKey] = {}
    names: set[str] = set()
    for index, raw in enumerate(entries):
        label = f"keys file {path}, entry {index + 1}" + (f" ({raw['name']!r})" if "name" in raw else "")
        try:
            entry = _Entry.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(f"{label}: {_first_problem(exc)}") from None
        digest = entry.digest()
        if entry.name in names:
            raise ConfigError(f"{label}: the name {entry.name!r} is used twice; names must be unique")
        if digest in by_digest:
            raise ConfigError(
                f"{label}: the same key as {by_digest[digest].name!r}; give each name its own key"
            )
        if digest == server_digest:
            raise ConfigError(f"{label}: this key is the server key (--key), which is already admin")
        names.add(entry.name)
        by_digest[digest] = ScopedKey(entry.name, entry.role)
    return KeyRing(by_digest)


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])

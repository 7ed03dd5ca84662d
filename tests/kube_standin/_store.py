"""The object store: objects by (resource, namespace, name), one global resourceVersion counter, and a
bounded history of change events that watches replay from.

Like etcd behind the real API server, every write takes the next resourceVersion, and a watch from a
resourceVersion older than the retained history (`compacted`) must start over with a fresh list.
Objects go in and out as copies, so nothing outside can change what is stored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from kube_standin._objects import Kind, deep_copy
from kube_standin._status import ApiError, already_exists, not_found

Key = tuple[str, str, str]  # (plural, namespace, name)


@dataclass(frozen=True)
class Event:
    """One change: `object` is the object after it (for DELETED, the last state with the delete's RV)."""

    resource_version: int
    type: str  # ADDED | MODIFIED | DELETED
    plural: str
    namespace: str
    object: dict[str, Any]


def expired(requested: int, oldest: int) -> ApiError:
    """The 410 a watch gets when its resourceVersion is older than the history."""
    return ApiError(410, f"too old resource version: {requested} ({oldest})", reason="Expired")


class Store:
    """Objects, the resourceVersion counter and the change history; `on_change` is called after writes."""

    def __init__(self, history_size: int, on_change: Callable[[], None] | None = None) -> None:
        #: Starts at 1, as etcd's revision does: a list never answers resourceVersion "0" (which a
        #: watch would read as "any version").
        self.resource_version = 1
        #: The newest resourceVersion whose event is no longer kept: watches from below it get 410.
        self.compacted = 0
        self._objects: dict[Key, dict[str, Any]] = {}
        self._history: deque[Event] = deque()
        self._history_size = history_size
        self.on_change = on_change

    def _write(self, event_type: str, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        key = (kind.plural, namespace, obj["metadata"]["name"])
        if event_type == "DELETED":
            del self._objects[key]
        else:
            self._objects[key] = obj
        self._history.append(Event(self.resource_version, event_type, kind.plural, namespace, deep_copy(obj)))
        while len(self._history) > self._history_size:
            self.compacted = self._history.popleft().resource_version
        if self.on_change is not None:
            self.on_change()
        return deep_copy(obj)

    def exists(self, kind: Kind, namespace: str, name: str) -> bool:
        """Whether the object is stored."""
        return (kind.plural, namespace, name) in self._objects

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """A copy of the object; 404 NotFound when there is none."""
        try:
            return deep_copy(self._objects[(kind.plural, namespace, name)])
        except KeyError:
            raise not_found(kind.group, kind.plural, name) from None

    def list(self, kind: Kind, namespace: str | None) -> list[dict[str, Any]]:
        """Copies of the objects of `kind` (in `namespace`, or all when None), by namespace then name."""
        return [
            deep_copy(obj)
            for (plural, ns, _), obj in sorted(self._objects.items(), key=lambda item: item[0])
            if plural == kind.plural and (namespace is None or ns == namespace)
        ]

    def create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object (metadata complete but resourceVersion); 409 AlreadyExists on a name clash."""
        name = obj["metadata"]["name"]
        if (kind.plural, namespace, name) in self._objects:
            raise already_exists(kind.group, kind.plural, name)
        return self._write("ADDED", kind, namespace, deep_copy(obj))

    def update(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace a stored object with `obj` (a MODIFIED event); 404 if it is gone."""
        key = (kind.plural, namespace, obj["metadata"]["name"])
        if key not in self._objects:
            raise not_found(kind.group, kind.plural, key[2])
        return self._write("MODIFIED", kind, namespace, deep_copy(obj))

    def remove(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """Delete a stored object (a DELETED event); its last state is returned."""
        current = self._objects.get((kind.plural, namespace, name))
        if current is None:
            raise not_found(kind.group, kind.plural, name)
        return self._write("DELETED", kind, namespace, deep_copy(current))

    def events_after(self, resource_version: int) -> list[Event]:
        """The events after `resource_version`, oldest first; 410 Expired if some are no longer kept."""
        if resource_version < self.compacted:
            raise expired(resource_version, self.compacted + 1)
        if not self._history or self._history[-1].resource_version <= resource_version:
            return []
        # Every write takes the next resourceVersion, so the history is a run of consecutive ones.
        skip = max(0, resource_version - self._history[0].resource_version + 1)
        return list(islice(self._history, skip, None))

    def forget_history(self) -> None:
        """Drop every kept event, as an etcd compaction does: older resourceVersions now get 410."""
        self._history.clear()
        self.compacted = self.resource_version

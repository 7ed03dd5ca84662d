"""The API server's semantics over the store: create (defaults, validation, generateName), get, list
with a label selector, and delete with the Background propagation policy.

Synchronous and free of I/O: the HTTP layer, the job controller and the kubelet all go through one
`KubeApi`, so every change is an event that watches see.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from kube_standin._objects import (
    POD,
    Kind,
    apply_defaults,
    check_shape,
    deep_copy,
    generated_name,
    validate,
)
from kube_standin._selectors import Requirement, labels_match, parse_label_selector
from kube_standin._status import ApiError, invalid, not_found, success_status
from kube_standin._store import Event, Store

#: Metadata the server owns: a client's values for these are ignored on create.
_SERVER_METADATA = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
    "managedFields",
)
_TERMINAL_PHASES = ("Succeeded", "Failed")


def rfc3339(epoch: float) -> str:
    """`2026-01-02T03:04:05Z`, the timestamp format of Kubernetes objects."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether `obj` has an owner reference to the object with `uid`."""
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


class KubeApi:
    """One cluster's API: every read and write the stand-in serves goes through here."""

    def __init__(
        self,
        store: Store,
        *,
        namespaces: Iterable[str] = ("default",),
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.store = store
        self.clock = clock
        self.rng = rng
        #: The namespaces that exist (namespaces are not served as objects: keraunos only names one).
        self.namespaces = frozenset(namespaces)

    def now(self) -> str:
        """The current time as an object timestamp."""
        return rfc3339(self.clock())

    def _uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    # --- create ---------------------------------------------------------------------------------

    def _check_identity(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> None:
        if obj.get("apiVersion") not in (None, "", kind.api_version):
            raise ApiError(
                400,
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API "
                f"version ({kind.api_version})",
            )
        if obj.get("kind") not in (None, "", kind.kind):
            raise ApiError(
                400, f"the kind in the data ({obj['kind']}) does not match the expected kind ({kind.kind})"
            )
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        metadata = obj.setdefault("metadata", {})
        if metadata.get("namespace") not in (None, "", namespace):
            raise ApiError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        metadata["namespace"] = namespace

    def create(self, kind: Kind, namespace: str, body: Any) -> dict[str, Any]:
        """POST: a new object with server metadata and defaults; 400/404/409/422 like the API server."""
        check_shape(kind, body)
        obj = deep_copy(body)
        self._check_identity(kind, namespace, obj)
        if namespace not in self.namespaces:
            raise not_found("", "namespaces", namespace)
        metadata = obj["metadata"]
        if metadata.get("resourceVersion"):
            # The API server's storage refuses it with a plain error, which reaches clients as a 500.
            raise ApiError(
                500, "Internal error occurred: resourceVersion should not be set on objects to be created"
            )
        for field in _SERVER_METADATA:
            metadata.pop(field, None)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = generated_name(metadata["generateName"], self.rng)
        obj.pop("status", None)
        validate(kind, obj)
        metadata["uid"] = self._uid()
        metadata["creationTimestamp"] = self.now()
        apply_defaults(kind, obj)
        return self.store.create(kind, namespace, obj)

    # --- read -----------------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """GET one object; 404 NotFound."""
        return self.store.get(kind, namespace, name)

    def list(self, kind: Kind, namespace: str, *, label_selector: str = "") -> dict[str, Any]:
        """GET a collection: a `<Kind>List` of the matching objects and the resourceVersion to watch from."""
        labels = parse_label_selector(label_selector)
        items = [obj for obj in self.store.list(kind, namespace) if labels_match(labels, obj)]
        for item in items:  # the API server leaves kind and apiVersion to the list
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.store.resource_version)},
            "items": items,
        }

    # --- controller writes ----------------------------------------------------------------------

    def write_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Set an object's status (the controllers' write; a MODIFIED event)."""
        current = self.store.get(kind, namespace, name)
        current["status"] = status
        return self.store.update(kind, namespace, current)

    def write(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a changed object as it is (the controllers' write; a MODIFIED event)."""
        return self.store.update(kind, obj["metadata"].get("namespace", ""), obj)

    # --- delete ---------------------------------------------------------------------------------

    def delete(self, kind: Kind, namespace: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """DELETE a Job with `propagationPolicy: Background`, the one policy keraunos sends: the Job goes
        at once, then its Pods (a running one gracefully: the kubelet stops its process first).

        Any other policy, or none (the API server would orphan the Pods), is 422 Invalid: the stand-in
        does not implement it.
        """
        current = self.store.get(kind, namespace, name)
        policy = options.get("propagationPolicy") or ""
        if policy != "Background":
            raise invalid(
                "DeleteOptions",
                "",
                "",
                [
                    (
                        "propagationPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{policy}": supported values: "Background" (the only policy '
                        "the stand-in implements)",
                    )
                ],
            )
        uid = current["metadata"]["uid"]
        self.store.remove(kind, namespace, name)
        for pod in self.store.list(POD, namespace):
            if owned_by(pod, uid):
                self.delete_pod(pod)
        return success_status({"name": name, "group": kind.group, "kind": kind.plural, "uid": uid})

    def delete_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Delete a Pod: at once when it never ran or has finished, else mark it for the kubelet to stop."""
        metadata = pod["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if not self.store.exists(POD, namespace, name):
            return pod
        pod = self.store.get(POD, namespace, name)
        phase = (pod.get("status") or {}).get("phase")
        if not pod["spec"].get("nodeName") or phase in _TERMINAL_PHASES:
            return self.store.remove(POD, namespace, name)
        if "deletionTimestamp" in pod["metadata"]:
            return pod
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        pod["metadata"]["deletionTimestamp"] = rfc3339(self.clock() + grace)
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        return self.store.update(POD, namespace, pod)


def visible_event(
    event: Event, kind: Kind, namespace: str, labels: tuple[Requirement, ...]
) -> dict[str, Any] | None:
    """The watch event a watcher of `kind` in `namespace` with these labels sees for `event`, or None.

    Nothing the stand-in serves changes an object's labels, so an object matches a selector for its
    whole life and the event passes through as it is.
    """
    if event.plural != kind.plural or event.namespace != namespace or not labels_match(labels, event.object):
        return None
    return {"type": event.type, "object": event.object}

"""The API server's semantics over the store: create (defaults, validation, generateName), get, list
with selectors and pages, replace, patch, the status subresource and delete with propagation policies.

Synchronous and free of I/O: the HTTP layer, the job controller and the kubelet all go through one
`KubeApi`, so every change is an event that watches see.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from kube_standin._objects import (
    JOB,
    NAMESPACE,
    POD,
    Kind,
    apply_defaults,
    check_shape,
    deep_copy,
    generated_name,
    immutable_job_change,
    validate,
)
from kube_standin._patch import apply_patch
from kube_standin._selectors import (
    FieldRequirement,
    Requirement,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from kube_standin._status import ApiError, invalid, not_found, qualified, success_status
from kube_standin._store import Event, Store, expired

#: Metadata the server owns: a client's values for these are ignored on create and update.
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
        for namespace in namespaces:
            if not store.exists(NAMESPACE, "", namespace):
                self.create(NAMESPACE, "", {"metadata": {"name": namespace}})

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
        if kind.namespaced:
            if metadata.get("namespace") not in (None, "", namespace):
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)

    def create(self, kind: Kind, namespace: str, body: Any) -> dict[str, Any]:
        """POST: a new object with server metadata and defaults; 400/404/409/422 like the API server."""
        check_shape(kind, body)
        obj = deep_copy(body)
        self._check_identity(kind, namespace, obj)
        if kind.namespaced and not self.store.exists(NAMESPACE, "", namespace):
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

    def list(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        limit: int = 0,
        continue_token: str = "",
    ) -> dict[str, Any]:
        """GET a collection: a `<Kind>List` of the matching objects, paged by `limit`/`continue`."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, kind.plural)
        list_rv, start = self.store.resource_version, ""
        if continue_token:
            list_rv, start = _decode_continue(continue_token)
            if list_rv < self.store.compacted:
                raise expired(list_rv, self.store.compacted + 1)
        items = [
            obj
            for obj in self.store.list(kind, namespace)
            if _sort_key(obj) > start and labels_match(labels, obj) and fields_match(fields, obj)
        ]
        metadata: dict[str, Any] = {"resourceVersion": str(list_rv)}
        if limit > 0 and len(items) > limit:
            metadata["continue"] = _encode_continue(list_rv, _sort_key(items[limit - 1]))
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        for item in items:  # the API server leaves kind and apiVersion to the list
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {"kind": kind.list_kind, "apiVersion": kind.api_version, "metadata": metadata, "items": items}

    # --- update ---------------------------------------------------------------------------------

    def _conflict(self, kind: Kind, name: str) -> ApiError:
        return ApiError(
            409,
            f'Operation cannot be fulfilled on {qualified(kind.group, kind.plural)} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
        )

    def replace(
        self, kind: Kind, namespace: str, name: str, body: Any, *, subresource: str = ""
    ) -> dict[str, Any]:
        """PUT: the whole object (or, for `status`, only its status); 409 on a stale resourceVersion."""
        check_shape(kind, body)
        new = deep_copy(body)
        self._check_identity(kind, namespace, new)
        current = self.store.get(kind, namespace, name)
        metadata = new["metadata"]
        if metadata.get("name") not in (None, "", name):
            raise ApiError(
                400,
                f"the name of the object ({metadata['name']}) does not match the name on the URL ({name})",
            )
        if metadata.get("resourceVersion") not in (None, "", current["metadata"]["resourceVersion"]):
            raise self._conflict(kind, name)
        if subresource == "status":
            updated = deep_copy(current)
            updated["status"] = new.get("status") or {}
            return self.store.update(kind, namespace, updated)
        metadata["name"] = name
        for field in _SERVER_METADATA:
            if field in current["metadata"]:
                metadata[field] = current["metadata"][field]
            else:
                metadata.pop(field, None)
        new["status"] = current.get("status") or {}
        self._check_update(kind, current, new)
        if kind is JOB and new.get("spec") != current.get("spec"):
            metadata["generation"] = int(current["metadata"].get("generation", 1)) + 1
        return self.store.update(kind, namespace, new)

    def _check_update(self, kind: Kind, current: dict[str, Any], new: dict[str, Any]) -> None:
        name = current["metadata"]["name"]
        causes = []
        if kind is JOB:
            causes = immutable_job_change(current, new)
        elif kind is POD:
            old_spec, new_spec = deep_copy(current.get("spec") or {}), deep_copy(new.get("spec") or {})
            for spec in (old_spec, new_spec):
                for container in spec.get("containers") or []:
                    container.pop("image", None)
                spec.pop("activeDeadlineSeconds", None)
            if old_spec != new_spec:
                causes = [
                    (
                        "spec",
                        "FieldValueForbidden",
                        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                        "`spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing tolerations)",
                    )
                ]
        if causes:
            raise invalid(kind.kind, kind.group, name, causes)
        validate(kind, new)

    def patch(
        self, kind: Kind, namespace: str, name: str, content_type: str, patch: Any, *, subresource: str = ""
    ) -> dict[str, Any]:
        """PATCH with a merge, strategic merge or JSON patch; then checked like an update."""
        current = self.store.get(kind, namespace, name)
        patched = apply_patch(content_type, current, patch)
        return self.replace(kind, namespace, name, patched, subresource=subresource)

    def write_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Set an object's status (the controllers' write; a MODIFIED event)."""
        current = self.store.get(kind, namespace, name)
        current["status"] = status
        return self.store.update(kind, namespace, current)

    def write(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a changed object as it is (the controllers' write; a MODIFIED event)."""
        return self.store.update(kind, obj["metadata"].get("namespace", ""), obj)

    # --- delete ---------------------------------------------------------------------------------

    def delete(
        self, kind: Kind, namespace: str, name: str, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """DELETE with `propagationPolicy` (Jobs default to Orphan, as in the API server) and a grace period.

        A bound, running Pod is deleted gracefully: it gets a deletionTimestamp, the kubelet stops its
        process and then removes it. A Job deleted in the Foreground stays (with a deletionTimestamp)
        until its Pods are gone; Background deletes the Job and then its Pods; Orphan leaves the Pods.
        """
        options = options or {}
        current = self.store.get(kind, namespace, name)
        preconditions = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if preconditions.get(field) not in (None, current["metadata"][field]):
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {qualified(kind.group, kind.plural)} "{name}": Precondition '
                    f"failed: {field}: {preconditions[field]}, {field} in object meta: {current['metadata'][field]}",
                )
        policy = options.get("propagationPolicy") or ("Orphan" if kind is JOB else "Background")
        if policy not in ("Orphan", "Background", "Foreground"):
            raise invalid(
                "DeleteOptions",
                "",
                "",
                [
                    (
                        "propagationPolicy",
                        "FieldValueNotSupported",
                        f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                    )
                ],
            )
        if kind is POD:
            return self.delete_pod(current, options.get("gracePeriodSeconds"))
        if kind is NAMESPACE:
            for namespaced in (JOB, POD):
                for obj in self.store.list(namespaced, name):
                    self.delete(
                        namespaced, name, obj["metadata"]["name"], {"propagationPolicy": "Background"}
                    )
            removed = self.store.remove(kind, namespace, name)
            return success_status({"name": name, "kind": kind.plural, "uid": removed["metadata"]["uid"]})
        uid = current["metadata"]["uid"]
        dependents = [pod for pod in self.store.list(POD, namespace) if owned_by(pod, uid)]
        if policy == "Foreground":
            if "deletionTimestamp" not in current["metadata"]:
                current["metadata"]["deletionTimestamp"] = self.now()
                current["metadata"]["deletionGracePeriodSeconds"] = 0
                current["metadata"]["finalizers"] = [
                    *(current["metadata"].get("finalizers") or []),
                    "foregroundDeletion",
                ]
                current = self.store.update(kind, namespace, current)
            for pod in dependents:
                self.delete_pod(pod, None)
            if not any(self.store.exists(POD, namespace, p["metadata"]["name"]) for p in dependents):
                self.store.remove(kind, namespace, name)
            return current
        if policy == "Orphan":
            # Like the garbage collector's orphan finalizer: the Job is marked (and that is what the
            # caller gets back), its Pods lose their owner reference, then the Job goes.
            current["metadata"]["deletionTimestamp"] = self.now()
            current["metadata"]["deletionGracePeriodSeconds"] = 0
            current["metadata"]["finalizers"] = [*(current["metadata"].get("finalizers") or []), "orphan"]
            marked = self.store.update(kind, namespace, current)
            for pod in dependents:
                refs = [ref for ref in pod["metadata"]["ownerReferences"] if ref.get("uid") != uid]
                pod["metadata"]["ownerReferences"] = refs
                if not refs:
                    del pod["metadata"]["ownerReferences"]
                self.store.update(POD, namespace, pod)
            self.store.remove(kind, namespace, name)
            return marked
        self.store.remove(kind, namespace, name)
        for pod in dependents:
            self.delete_pod(pod, None)
        return success_status({"name": name, "group": kind.group, "kind": kind.plural, "uid": uid})

    def delete_pod(self, pod: dict[str, Any], grace_seconds: int | None) -> dict[str, Any]:
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
        grace = (
            pod["spec"].get("terminationGracePeriodSeconds", 30) if grace_seconds is None else grace_seconds
        )
        pod["metadata"]["deletionTimestamp"] = rfc3339(self.clock() + grace)
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        return self.store.update(POD, namespace, pod)

    def delete_collection(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        label_selector: str = "",
        field_selector: str = "",
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """DELETE on a collection: every matching object, as a list of what was deleted."""
        matching = self.list(kind, namespace, label_selector=label_selector, field_selector=field_selector)
        for item in matching["items"]:
            self.delete(kind, item["metadata"].get("namespace", ""), item["metadata"]["name"], options)
        return matching


def visible_event(
    event: Event,
    kind: Kind,
    namespace: str | None,
    labels: tuple[Requirement, ...],
    fields: tuple[FieldRequirement, ...],
) -> dict[str, Any] | None:
    """The watch event a watcher with these filters sees for `event`, or None.

    Like the API server's watch cache, an object that starts to match a selector arrives as ADDED and
    one that stops matching as DELETED.
    """
    if event.plural != kind.plural or (namespace is not None and event.namespace != namespace):
        return None

    def matches(obj: dict[str, Any] | None) -> bool:
        return obj is not None and labels_match(labels, obj) and fields_match(fields, obj)

    now_matches = matches(event.object)
    before_matches = event.type == "MODIFIED" and matches(event.previous)
    if event.type == "MODIFIED" and now_matches != before_matches:
        event_type = "ADDED" if now_matches else "DELETED"
    elif now_matches:
        event_type = event.type
    else:
        return None
    return {"type": event_type, "object": event.object}


def _sort_key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', '')}\x00{obj['metadata']['name']}"


def _encode_continue(resource_version: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": resource_version, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(data["rv"]), str(data["start"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise ApiError(
            400, "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ) from None

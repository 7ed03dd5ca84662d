"""The resources the stand-in serves (batch/v1 Jobs, and the Pods their controller makes), the verbs
each takes, the defaults the real API server fills in on create, and its validation (400 for a body
of the wrong shape, 422 for invalid values), as pure functions over plain JSON objects.

The verbs are those of the runner's RBAC Role (deploy/k8s/rbac.yaml), which are every call
keraunos/controller/runners/_k8s_api.py makes: jobs create/get/list/watch/delete, pods list,
pods/log get. Another verb is 405 MethodNotAllowed; there is no discovery beyond `/version`.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_standin._selectors import label_key_problem, label_value_problem
from kube_standin._status import ApiError, invalid

#: The Kubernetes release the stand-in answers as (inside kr8s 0.20's supported range).
SERVER_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_GENERATED_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the API server's alphabet: no vowels, no 0/1/3


@dataclass(frozen=True)
class Kind:
    """One served resource: where it lives in the API and the verbs it (and its subresources) take."""

    group: str
    version: str
    plural: str
    kind: str
    verbs: tuple[str, ...]
    subresources: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def api_version(self) -> str:
        """`v1` or `batch/v1`."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def takes(self, verb: str, subresource: str = "") -> bool:
        """Whether a request of `verb` on this resource (or its `subresource`) is served."""
        return verb in (dict(self.subresources)[subresource] if subresource else self.verbs)


POD = Kind("", "v1", "pods", "Pod", ("list",), (("log", ("get",)),))
JOB = Kind("batch", "v1", "jobs", "Job", ("create", "get", "list", "watch", "delete"))

#: Every served resource by (group, plural).
KINDS: dict[tuple[str, str], Kind] = {(k.group, k.plural): k for k in (POD, JOB)}


def generated_name(prefix: str, rng: random.Random) -> str:
    """`generateName` resolved as the API server does: the prefix (cut to 58) and 5 random characters."""
    return prefix[:58] + "".join(rng.choice(_GENERATED_CHARS) for _ in range(5))


# --- shape checks (400 BadRequest, like the API server's JSON decoding errors) ---------------------


def _decode_error(kind: Kind, path: str, want: str, value: Any) -> ApiError:
    got = {str: "string", bool: "bool", int: "number", float: "number", list: "array", dict: "object"}.get(
        type(value), "null"
    )
    return ApiError(
        400,
        f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: json: cannot '
        f"unmarshal {got} into Go struct field {path} of type {want}",
    )


def _expect_map(kind: Kind, value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _decode_error(kind, path, "object", value)
    return value


def _expect_list(kind: Kind, value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _decode_error(kind, path, "array", value)
    return value


def _expect_strings(kind: Kind, value: Any, path: str) -> None:
    for item in _expect_list(kind, value, path):
        if not isinstance(item, str):
            raise _decode_error(kind, path, "string", item)


def _expect_string_map(kind: Kind, value: Any, path: str) -> None:
    for item in _expect_map(kind, value, path).values():
        if not isinstance(item, str):
            raise _decode_error(kind, path, "string", item)


def _expect_int(kind: Kind, value: Any, path: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _decode_error(kind, path, "int64", value)


def _check_pod_spec_shape(kind: Kind, spec: Any, path: str) -> None:
    spec = _expect_map(kind, spec, path)
    for field in ("terminationGracePeriodSeconds", "activeDeadlineSeconds"):
        _expect_int(kind, spec.get(field), f"{path}.{field}")
    for key in ("containers", "initContainers"):
        for container in _expect_list(kind, spec.get(key), f"{path}.{key}"):
            container = _expect_map(kind, container, f"{path}.{key}")
            for field in ("name", "image", "workingDir"):
                if field in container and not isinstance(container[field], str):
                    raise _decode_error(kind, f"Container.{path}.{key}.{field}", "string", container[field])
            _expect_strings(kind, container.get("command"), f"Container.{path}.{key}.command")
            _expect_strings(kind, container.get("args"), f"Container.{path}.{key}.args")
            for env in _expect_list(kind, container.get("env"), f"Container.{path}.{key}.env"):
                env = _expect_map(kind, env, f"Container.{path}.{key}.env")
                for field in ("name", "value"):
                    if field in env and not isinstance(env[field], str):
                        raise _decode_error(kind, f"EnvVar.{path}.{key}.env.{field}", "string", env[field])


def check_shape(kind: Kind, obj: Any) -> None:
    """400 BadRequest when `obj` could not even be decoded into the Go type (wrong JSON types)."""
    if not isinstance(obj, dict):
        raise ApiError(
            400, f"the body of the request was in an unknown format - expected a {kind.kind} object"
        )
    metadata = _expect_map(kind, obj.get("metadata"), "ObjectMeta.metadata")
    for field in ("name", "generateName", "namespace", "resourceVersion"):
        if field in metadata and not isinstance(metadata[field], str):
            raise _decode_error(kind, f"ObjectMeta.metadata.{field}", "string", metadata[field])
    _expect_string_map(kind, metadata.get("labels"), "ObjectMeta.metadata.labels")
    _expect_string_map(kind, metadata.get("annotations"), "ObjectMeta.metadata.annotations")
    spec = _expect_map(kind, obj.get("spec"), "spec")
    if kind is POD:
        _check_pod_spec_shape(kind, spec, "spec")
    elif kind is JOB:
        for field in (
            "parallelism",
            "completions",
            "backoffLimit",
            "activeDeadlineSeconds",
            "ttlSecondsAfterFinished",
        ):
            _expect_int(kind, spec.get(field), f"JobSpec.spec.{field}")
        template = _expect_map(kind, spec.get("template"), "JobSpec.spec.template")
        template_meta = _expect_map(kind, template.get("metadata"), "spec.template.metadata")
        _expect_string_map(kind, template_meta.get("labels"), "spec.template.metadata.labels")
        _check_pod_spec_shape(kind, template.get("spec"), "spec.template.spec")


# --- defaults ----------------------------------------------------------------------------------------


def _default_container(container: dict[str, Any]) -> None:
    image = container.get("image") or ""
    tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
    container.setdefault("imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent")
    container.setdefault("resources", {})
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")


def _default_pod_spec(spec: dict[str, Any], *, restart_policy: str | None) -> None:
    if restart_policy is not None:
        spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if isinstance(container, dict):
            _default_container(container)


def apply_defaults(kind: Kind, obj: dict[str, Any]) -> None:
    """Fill in what the API server defaults on create (needs metadata.uid set already)."""
    metadata = obj["metadata"]
    if kind is POD:
        spec = obj.setdefault("spec", {})
        _default_pod_spec(spec, restart_policy="Always")
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif kind is JOB:
        spec = obj.setdefault("spec", {})
        if spec.get("parallelism") is None and spec.get("completions") is None:
            spec["completions"] = 1
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        uid, name = metadata["uid"], metadata["name"]
        spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
        template = spec.setdefault("template", {})
        template_meta = template.setdefault("metadata", {})
        template_meta.setdefault("creationTimestamp", None)
        template_meta["labels"] = {
            **(template_meta.get("labels") or {}),
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
        _default_pod_spec(template.setdefault("spec", {}), restart_policy=None)
        if not metadata.get("labels"):
            metadata["labels"] = dict(template_meta["labels"])
        metadata["generation"] = 1
        obj["status"] = {}


# --- validation (422 Invalid) ------------------------------------------------------------------------

Cause = tuple[str, str, str]  # (field, reason, message) as in the API server's field errors


def _name_causes(kind: Kind, metadata: Mapping[str, Any]) -> list[Cause]:
    name = metadata.get("name") or ""
    if not name:
        return [("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")]
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return [
            (
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character "
                "(e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        ]
    return []


def _label_causes(labels: Mapping[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for key, value in labels.items():
        if problem := label_key_problem(key):
            causes.append((path, "FieldValueInvalid", f'Invalid value: "{key}": {problem}'))
        if problem := label_value_problem(value):
            causes.append((path, "FieldValueInvalid", f'Invalid value: "{value}": {problem}'))
    return causes


def _container_causes(containers: list[Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    seen: set[str] = set()
    for index, container in enumerate(containers):
        where = f"{path}[{index}]"
        name = container.get("name") or ""
        if not name:
            causes.append((f"{where}.name", "FieldValueRequired", "Required value"))
        elif len(name) > 63 or not _DNS_LABEL.match(name):
            causes.append(
                (
                    f"{where}.name",
                    "FieldValueInvalid",
                    f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case '
                    "alphanumeric characters or '-', and must start and end with an alphanumeric character",
                )
            )
        elif name in seen:
            causes.append((f"{where}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        seen.add(name)
        if not container.get("image"):
            causes.append((f"{where}.image", "FieldValueRequired", "Required value"))
        for env_index, env in enumerate(container.get("env") or []):
            env_name = env.get("name") or ""
            env_where = f"{where}.env[{env_index}].name"
            if not env_name:
                causes.append((env_where, "FieldValueRequired", "Required value"))
            elif not _ENV_NAME.match(env_name):
                causes.append(
                    (
                        env_where,
                        "FieldValueInvalid",
                        f'Invalid value: "{env_name}": a valid environment variable name must consist of '
                        "alphabetic characters, digits, '_', '-', or '.', and must not start with a digit",
                    )
                )
    return causes


def _pod_spec_causes(spec: Mapping[str, Any], path: str, allowed_restart: tuple[str, ...]) -> list[Cause]:
    causes: list[Cause] = []
    containers = spec.get("containers") or []
    if not containers:
        causes.append((f"{path}.containers", "FieldValueRequired", "Required value"))
    causes += _container_causes(containers, f"{path}.containers")
    causes += _container_causes(spec.get("initContainers") or [], f"{path}.initContainers")
    restart = spec.get("restartPolicy")
    if restart is None:
        supported = ", ".join(f'"{r}"' for r in allowed_restart)
        causes.append(
            (f"{path}.restartPolicy", "FieldValueRequired", f"Required value: valid values: {supported}")
        )
    elif restart not in allowed_restart:
        supported = ", ".join(f'"{r}"' for r in allowed_restart)
        causes.append(
            (
                f"{path}.restartPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{restart}": supported values: {supported}',
            )
        )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        causes.append(
            (
                f"{path}.activeDeadlineSeconds",
                "FieldValueInvalid",
                f"Invalid value: {deadline}: must be between 1 and 2147483647, inclusive",
            )
        )
    return causes


def _job_causes(job: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = job.get("spec") or {}
    name = job["metadata"].get("name") or ""
    if len(name) > 63:
        causes.append(
            (
                "spec.template.labels",
                "FieldValueInvalid",
                f'Invalid value: "{name}": must be no more than 63 characters',
            )
        )
    for field in ("parallelism", "completions", "backoffLimit", "ttlSecondsAfterFinished"):
        value = spec.get(field)
        if value is not None and value < 0:
            causes.append(
                (
                    f"spec.{field}",
                    "FieldValueInvalid",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                )
            )
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and deadline <= 0:
        causes.append(
            (
                "spec.activeDeadlineSeconds",
                "FieldValueInvalid",
                f"Invalid value: {deadline}: must be greater than or equal to 1",
            )
        )
    template = spec.get("template") or {}
    causes += _label_causes(
        (template.get("metadata") or {}).get("labels") or {}, "spec.template.metadata.labels"
    )
    causes += _pod_spec_causes(template.get("spec") or {}, "spec.template.spec", ("OnFailure", "Never"))
    return causes


def validate(kind: Kind, obj: Mapping[str, Any]) -> None:
    """422 Invalid (with one cause per problem) unless `obj` is a valid new object of `kind`."""
    metadata = obj.get("metadata") or {}
    causes = _name_causes(kind, metadata)
    causes += _label_causes(metadata.get("labels") or {}, "metadata.labels")
    for key in metadata.get("annotations") or {}:
        if problem := label_key_problem(key):
            causes.append(("metadata.annotations", "FieldValueInvalid", f'Invalid value: "{key}": {problem}'))
    if kind is POD:
        causes += _pod_spec_causes(obj.get("spec") or {}, "spec", ("Always", "OnFailure", "Never"))
    elif kind is JOB:
        causes += _job_causes(obj)
    if causes:
        raise invalid(
            kind.kind, kind.group, metadata.get("name") or metadata.get("generateName") or "", causes
        )


def deep_copy(obj: Any) -> Any:
    """A copy that shares nothing with `obj` (objects go in and out of the store this way)."""
    return copy.deepcopy(obj)

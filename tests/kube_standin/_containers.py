"""What the kubelet needs to run a container as a local process, and the Pod statuses it reports:
the command line and environment (with `$(VAR)` references expanded as Kubernetes does), and the
`status` of a Pod that is running, has finished or could not start. Pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kube_standin._objects import deep_copy

#: The address every Pod of the stand-in reports: its processes run on this machine.
POD_IP = "127.0.0.1"
_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]\Z")


class ContainerConfigError(Exception):
    """The container cannot be started as configured (the Pod waits, reason CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REFERENCE.sub(replace, text)


def _field_value(pod: Mapping[str, Any], path: str) -> str:
    metadata, spec = pod["metadata"], pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": POD_IP,
        "status.podIP": POD_IP,
    }
    if path in simple:
        return str(simple[path] or "")
    if match := _FIELD_INDEX.match(path):
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ContainerConfigError(f"unsupported fieldRef fieldPath {path!r}")


def container_environment(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The container's own variables: `value` (with `$(VAR)` expanded) and `valueFrom.fieldRef`.

    Secrets, ConfigMaps and resource fields are not served, so `secretKeyRef`, `configMapKeyRef`,
    `resourceFieldRef` and `envFrom` raise `ContainerConfigError`, as a missing Secret would.
    """
    if container.get("envFrom"):
        raise ContainerConfigError(
            "envFrom is not supported by the stand-in (it serves no ConfigMaps or Secrets)"
        )
    env: dict[str, str] = {"HOSTNAME": pod["metadata"]["name"]}
    for var in container.get("env") or []:
        name = var["name"]
        source = var.get("valueFrom")
        if source is None:
            env[name] = expand(var.get("value") or "", env)
        elif "fieldRef" in source:
            env[name] = _field_value(pod, source["fieldRef"].get("fieldPath", ""))
        else:
            ref = next(iter(source), "valueFrom")
            raise ContainerConfigError(
                f"env {name}: valueFrom.{ref} is not supported by the stand-in (it serves no ConfigMaps or Secrets)"
            )
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """`command` + `args` with `$(VAR)` expanded; the image's entrypoint is unknown, so a command is needed."""
    command = [expand(part, env) for part in container.get("command") or []]
    args = [expand(part, env) for part in container.get("args") or []]
    if not command:
        raise ContainerConfigError(
            f"container {container.get('name')!r} has no command: the stand-in ignores images, so it "
            "can only run an explicit command"
        )
    return command + args


def _conditions(now: str, *, ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
    def condition(kind: str, value: bool, why: str | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "type": kind,
            "status": "True" if value else "False",
            "lastProbeTime": None,
            "lastTransitionTime": now,
        }
        if why and not value:
            entry["reason"] = why
        return entry

    return [
        condition("PodReadyToStartContainers", True),
        condition("Initialized", True),
        condition("Ready", ready, reason),
        condition("ContainersReady", ready, reason),
        condition("PodScheduled", True),
    ]


def _base_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    status = deep_copy(pod.get("status") or {})
    status.update(
        hostIP=POD_IP, hostIPs=[{"ip": POD_IP}], podIP=POD_IP, podIPs=[{"ip": POD_IP}], qosClass="BestEffort"
    )
    return status


def running_status(
    pod: Mapping[str, Any], container: Mapping[str, Any], pid: int, now: str
) -> dict[str, Any]:
    """The status of a Pod whose container process has started."""
    status = _base_status(pod)
    status.update(
        phase="Running",
        startTime=status.get("startTime") or now,
        conditions=_conditions(now, ready=True),
        containerStatuses=[
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "containerID": f"stand-in://{pid}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
                "lastState": {},
            }
        ],
    )
    return status


def waiting_status(
    pod: Mapping[str, Any], container: Mapping[str, Any], reason: str, message: str, now: str
) -> dict[str, Any]:
    """The status of a Pod whose container cannot be created (it stays Pending)."""
    status = _base_status(pod)
    status.update(
        phase="Pending",
        startTime=status.get("startTime") or now,
        conditions=_conditions(now, ready=False, reason="ContainersNotReady"),
        containerStatuses=[
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
                "lastState": {},
            }
        ],
    )
    return status


def exit_code_of(returncode: int) -> int:
    """A process's exit status as a container's: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_status(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    exit_code: int,
    reason: str,
    started: str,
    finished: str,
    message: str = "",
    container_id: str = "",
) -> dict[str, Any]:
    """The status of a Pod whose container ended (`Succeeded` on exit 0, else `Failed`)."""
    status = _base_status(pod)
    terminated: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": finished,
    }
    if message:
        terminated["message"] = message
    if container_id:
        terminated["containerID"] = container_id
    status.update(
        phase="Succeeded" if exit_code == 0 else "Failed",
        startTime=status.get("startTime") or started,
        conditions=_conditions(
            finished, ready=False, reason="PodCompleted" if exit_code == 0 else "PodFailed"
        ),
        containerStatuses=[
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
                "lastState": {},
                **({"containerID": container_id} if container_id else {}),
            }
        ],
    )
    return status


def log_tail(text: str, *, lines: int = 80, limit: int = 2048) -> str:
    """The termination message `FallbackToLogsOnError` takes from a failed container's log."""
    tail = "\n".join(text.splitlines()[-lines:])
    return tail[-limit:]

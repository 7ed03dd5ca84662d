"""What tests steer and observe in the stand-in: injected failures for the next requests of a verb and
resource, and a count of every request by verb and resource (with a short log, for rate checks).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any

from kube_standin._objects import KINDS
from kube_standin._status import REASONS, ApiError, qualified

#: The verbs the stand-in serves (see `_objects`), and `*` for any.
VERBS = ("get", "list", "watch", "create", "delete", "*")


@dataclass
class Fault:
    """Answer the next `count` requests of `verb` on `resource` (`*` matches any) with `code`."""

    verb: str
    resource: str
    code: int
    count: int = 1
    message: str = ""
    retry_after_seconds: int = 1

    def matches(self, verb: str, resource: str) -> bool:
        """Whether a request of `verb` on `resource` takes this fault."""
        return self.verb in ("*", verb) and self.resource in ("*", resource)


def fault_from_json(data: Any) -> Fault:
    """A `Fault` from `{"verb", "resource", "code", "count"?, "message"?, "retry_after_seconds"?}`."""
    if not isinstance(data, dict):
        raise ValueError("a fault is a JSON object")
    unknown = set(data) - {"verb", "resource", "code", "count", "message", "retry_after_seconds"}
    if unknown:
        raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
    fault = Fault(
        verb=data.get("verb", "*"),
        resource=data.get("resource", "*"),
        code=data.get("code", 500),
        count=data.get("count", 1),
        message=data.get("message", ""),
        retry_after_seconds=data.get("retry_after_seconds", 1),
    )
    if fault.verb not in VERBS:
        raise ValueError(f"verb must be one of {', '.join(VERBS)}, not {fault.verb!r}")
    if not isinstance(fault.code, int) or not 400 <= fault.code <= 599:
        raise ValueError(f"code must be an HTTP error status (400-599), not {fault.code!r}")
    if not isinstance(fault.count, int) or fault.count < 1:
        raise ValueError(f"count must be a positive integer, not {fault.count!r}")
    if not isinstance(fault.message, str) or not isinstance(fault.resource, str):
        raise ValueError("message and resource must be strings")
    return fault


def fault_error(fault: Fault, verb: str, resource: str, namespace: str | None, name: str | None) -> ApiError:
    """The error a request gets from `fault`, worded like the real API server's."""
    plural, _, _ = resource.partition("/")
    group = next((k.group for k in KINDS.values() if k.plural == plural), "")
    target = qualified(group, resource)
    message = fault.message
    details: dict[str, Any] = {"kind": resource}
    if group:
        details["group"] = group
    if name:
        details["name"] = name
    if not message:
        if fault.code == 403:
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            name_part = f' "{name}"' if name else ""
            message = (
                f'{target}{name_part} is forbidden: User "system:serviceaccount:{namespace or "default"}:'
                f'keraunos-controller" cannot {verb} resource "{resource}" in API group "{group}"{where}'
            )
        elif fault.code == 429:
            message = "Too many requests, please try again later."
        elif fault.code == 422:
            message = f'{target} "{name or ""}" is invalid: rejected by a fault the test injected'
        elif fault.code >= 500:
            message = "Internal error occurred: a fault the test injected"
        else:
            message = f"a fault the test injected ({fault.code})"
    if fault.code == 429:
        details["retryAfterSeconds"] = fault.retry_after_seconds
    return ApiError(fault.code, message, reason=REASONS.get(fault.code), details=details)


class Controls:
    """Pending faults and request counts of one stand-in (reset by tests between scenarios)."""

    def __init__(self, keep_requests: int = 2000) -> None:
        self.faults: list[Fault] = []
        self.counts: Counter[str] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=keep_requests)

    def take_fault(self, verb: str, resource: str) -> Fault | None:
        """The first pending fault matching this request, used up by one; None when there is none."""
        for fault in self.faults:
            if fault.matches(verb, resource):
                fault.count -= 1
                if fault.count == 0:
                    self.faults.remove(fault)
                return fault
        return None

    def record(self, verb: str, resource: str, namespace: str | None, name: str | None, code: int) -> None:
        """Count one API request (faulted ones too)."""
        self.counts[f"{verb} {resource}"] += 1
        self.recent.append(
            {
                "time": time.time(),
                "verb": verb,
                "resource": resource,
                "namespace": namespace,
                "name": name,
                "code": code,
            }
        )

    def report(self) -> dict[str, Any]:
        """`{"counts": {"create jobs": 2, ...}, "recent": [{time, verb, resource, namespace, name, code}]}`."""
        return {"counts": dict(self.counts), "recent": list(self.recent)}

    def pending(self) -> list[dict[str, Any]]:
        """The faults not used up yet."""
        return [asdict(fault) for fault in self.faults]

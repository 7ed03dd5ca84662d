"""Names and labels of the Kubernetes runner's Jobs, as pure functions of rollout and attempt ids.

A Job name is `kr-` + a sanitised prefix of the rollout id + `-` + 8 hex digits of a hash of
(rollout, attempt): at most 63 characters, a valid DNS-1123 label, stable for one attempt and
different for the next, so a retry never collides with the Job of an earlier attempt. Rollout and
attempt ids may hold characters a label value cannot (`:`) or be longer than 63 characters, so
their labels carry the id itself when it fits and a sanitised, hashed form when it does not; the
exact ids travel in annotations.
"""

from __future__ import annotations

import hashlib
import re

#: Most characters of a DNS-1123 label (Job names, label values).
MAX_NAME = 63
#: Every Job name starts with this.
NAME_PREFIX = "kr-"
#: Hex digits of the (rollout, attempt) hash at the end of a Job name.
HASH_HEX = 8

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def _digest(*parts: str) -> str:
    # NUL cannot occur in an id, so ("a", "b:c") and ("a:b", "c") hash differently.
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def job_name(rollout_id: str, attempt_id: str) -> str:
    """The Job of one attempt: `kr-<rollout prefix>-<8 hex>`, DNS-1123, at most 63 characters."""
    suffix = _digest(rollout_id, attempt_id)[:HASH_HEX]
    room = MAX_NAME - len(NAME_PREFIX) - 1 - HASH_HEX
    prefix = re.sub(r"[^a-z0-9]+", "-", rollout_id.lower()).strip("-")[:room].rstrip("-")
    return f"{NAME_PREFIX}{prefix}-{suffix}" if prefix else f"{NAME_PREFIX}{suffix}"


def is_dns_label(name: str) -> bool:
    """Whether `name` is a valid DNS-1123 label (what Kubernetes wants of a Job name)."""
    return len(name) <= MAX_NAME and bool(_DNS_LABEL.match(name))


def label_value(value: str) -> str:
    """`value` itself when it is a valid label value, else a sanitised prefix and a hash of it."""
    if len(value) <= MAX_NAME and _LABEL_VALUE.match(value):
        return value
    suffix = _digest(value)[:HASH_HEX]
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[: MAX_NAME - 1 - HASH_HEX]
    prefix = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", prefix)
    return f"{prefix}-{suffix}" if prefix else suffix


def is_label_value(value: str) -> bool:
    """Whether `value` may be a Kubernetes label value."""
    return len(value) <= MAX_NAME and bool(_LABEL_VALUE.match(value))

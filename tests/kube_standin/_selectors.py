"""Label and field selectors: parsed from their query-string syntax, matched against plain objects.

Label selectors take the full syntax (`a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`,
`!a`, comma-separated and ANDed). Field selectors take `=`, `==` and `!=` on the fields the real API
server supports for the resource. Empty terms are skipped, as the API server does (kr8s sends
`metadata.name=x,` with a trailing comma).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_standin._status import ApiError

_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^(({_DNS_SUBDOMAIN})/)?{_NAME}\Z")
_LABEL_VALUE = re.compile(rf"^({_NAME})?\Z")
_SET_TERM = re.compile(r"^(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\Z")
_EQUALITY_TERM = re.compile(r"^(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\Z")


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a valid label key (None when it is)."""
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if prefix and len(prefix) > 253:
        return "prefix part must be no more than 253 characters"
    if not _LABEL_KEY.match(key):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
            "end with an alphanumeric character"
        )
    return None


def label_value_problem(value: Any) -> str | None:
    """Why `value` is not a valid label value (None when it is)."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > 63:
        return "must be no more than 63 characters"
    if not _LABEL_VALUE.match(value):
        return (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: `key op values` (values empty for exists/!exists)."""

    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels satisfies this term."""
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


def _terms(selector: str) -> list[str]:
    """Split on commas outside parentheses; empty terms dropped."""
    terms, depth, current = [], 0, []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    return [term for term in terms if term]


def _bad_label_selector(term: str, why: str) -> ApiError:
    return ApiError(400, f"unable to parse requirement: {why} in {term!r}")


def parse_label_selector(selector: str) -> tuple[Requirement, ...]:
    """The requirements of a label selector; 400 BadRequest `ApiError` for bad syntax."""
    requirements = []
    for term in _terms(selector):
        if term.startswith("!"):
            key, op, values = term[1:].strip(), "!exists", frozenset[str]()
        elif match := _SET_TERM.match(term):
            key, op = match["key"], match["op"]
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
        elif match := _EQUALITY_TERM.match(term):
            key, op = match["key"], "notin" if match["op"] == "!=" else "in"
            values = frozenset({match["value"]})
        elif re.fullmatch(r"[^\s!=(),]+", term):
            key, op, values = term, "exists", frozenset[str]()
        else:
            raise _bad_label_selector(term, "invalid syntax")
        if problem := label_key_problem(key):
            raise _bad_label_selector(term, f"key {key!r}: {problem}")
        for value in values:
            if problem := label_value_problem(value):
                raise _bad_label_selector(term, f"value {value!r}: {problem}")
        requirements.append(Requirement(key, op, values))
    return tuple(requirements)


def labels_match(requirements: tuple[Requirement, ...], obj: Mapping[str, Any]) -> bool:
    """Whether `obj`'s metadata.labels satisfy every requirement."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(requirement.matches(labels) for requirement in requirements)


def _path(*keys: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return "" if value is None else str(value)

    return get


def _job_successful(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("succeeded") or 0)


_COMMON_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}

#: The fields each resource can be selected by, as in the real API server.
FIELDS: dict[str, dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "pods": {
        **_COMMON_FIELDS,
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
    },
    "jobs": {**_COMMON_FIELDS, "status.successful": _job_successful},
    "namespaces": {**_COMMON_FIELDS, "status.phase": _path("status", "phase")},
}


@dataclass(frozen=True)
class FieldRequirement:
    """One term of a field selector."""

    field: str
    value: str
    equal: bool
    getter: Callable[[Mapping[str, Any]], str]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether `obj` satisfies this term."""
        return (self.getter(obj) == self.value) == self.equal


def parse_field_selector(selector: str, plural: str) -> tuple[FieldRequirement, ...]:
    """The terms of a field selector on `plural`; 400 BadRequest for bad syntax or an unknown field."""
    supported = FIELDS.get(plural, _COMMON_FIELDS)
    requirements = []
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        match = re.fullmatch(r"(?P<field>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>.*)", term)
        if match is None:
            raise ApiError(400, f"invalid selector: '{selector}'; can't understand '{term}'")
        field = match["field"]
        if field not in supported:
            raise ApiError(400, f"field label not supported: {field} (supported: {', '.join(supported)})")
        requirements.append(FieldRequirement(field, match["value"], match["op"] != "!=", supported[field]))
    return tuple(requirements)


def fields_match(requirements: tuple[FieldRequirement, ...], obj: Mapping[str, Any]) -> bool:
    """Whether `obj` satisfies every field requirement."""
    return all(requirement.matches(obj) for requirement in requirements)

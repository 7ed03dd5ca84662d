"""Label selectors: parsed from their query-string syntax, matched against plain objects.

Only what keraunos's runner sends: equality terms (`a=b`, `a==b`, `a!=b`), comma-separated and
ANDed; set-based terms (`in`, `notin`, `a`, `!a`) are refused with 400 (a real API server takes
them). Empty terms are skipped, as the API server does. Field selectors are not served.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_standin._status import ApiError

_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^(({_DNS_SUBDOMAIN})/)?{_NAME}\Z")
_LABEL_VALUE = re.compile(rf"^({_NAME})?\Z")
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
    """One term of a label selector: `key=value` (`equal`) or `key!=value`."""

    key: str
    value: str
    equal: bool = True

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels satisfies this term (`!=` holds for a missing key)."""
        return (labels.get(self.key) == self.value) == self.equal


def _bad_label_selector(term: str, why: str) -> ApiError:
    return ApiError(400, f"unable to parse requirement: {why} in {term!r}")


def parse_label_selector(selector: str) -> tuple[Requirement, ...]:
    """The requirements of a label selector; 400 BadRequest `ApiError` for bad or set-based syntax."""
    requirements = []
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        match = _EQUALITY_TERM.match(term)
        if match is None:
            raise _bad_label_selector(term, "the stand-in takes only equality terms (key=value, key!=value)")
        key, value = match["key"], match["value"]
        if problem := label_key_problem(key):
            raise _bad_label_selector(term, f"key {key!r}: {problem}")
        if problem := label_value_problem(value):
            raise _bad_label_selector(term, f"value {value!r}: {problem}")
        requirements.append(Requirement(key, value, match["op"] != "!="))
    return tuple(requirements)


def labels_match(requirements: tuple[Requirement, ...], obj: Mapping[str, Any]) -> bool:
    """Whether `obj`'s metadata.labels satisfy every requirement."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(requirement.matches(labels) for requirement in requirements)

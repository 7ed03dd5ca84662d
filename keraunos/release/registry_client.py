"""A synchronous HTTP client of the gateway's resource registry and audit log (docs/protocol.md#resources).

One method per route of `/api/resources` (its per-version `stats` included), `GET
/api/rollouts/{rollout_id}/resources` and `GET /api/audit`; answers come back as the shapes of
`keraunos.resources`, `keraunos.release.version_stats` and `keraunos.audit`.
As the controller's client does (`keraunos.controller.client`), an answer the caller did not ask
for raises `GatewayError` carrying the status and the gateway's `detail` text, and a gateway that
cannot be reached raises `GatewayUnreachable`. `refused_by_caller` tells the CLI which of those
is the caller's mistake (a 4xx: a wrong name, key or version) and which a failure of the gateway.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from keraunos.audit import AuditEntry
from keraunos.controller._urls import path_segment
from keraunos.controller.client import GatewayError, GatewayUnreachable
from keraunos.release.version_stats import ResourceStats
from keraunos.resources import Label, LabelMove, PushResult, ResourcePush, ResourceSummary, ResourceVersion

#: Most audit entries one `GET /api/audit` page asks for.
AUDIT_PAGE = 500


@dataclass(frozen=True, slots=True)
class AuditPage:
    """One page of `GET /api/audit`: its entries, and the count and head hash the ledger keeps."""

    items: list[AuditEntry]
    count: int
    head: str


@dataclass(frozen=True, slots=True)
class ResourceDiff:
    """`GET /api/resources/{name}/diff`: the two versions compared and the unified diff between them."""

    name: str
    old: int
    new: int
    diff: str


def refused_by_caller(error: GatewayError) -> bool:
    """Whether the gateway refused the request as the caller's mistake (4xx other than 408 and 429,
    which are worth a retry): fixing the name, version, body or key is what helps."""
    return 400 <= error.status < 500 and error.status not in (408, 429)


class RegistryClient:
    """One gateway, reached with a key (the server key or a scoped key). Use as a context manager."""

    def __init__(self, base_url: str, key: str, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _request(
        self, method: str, path: str, *, ok: Iterable[int] = (200,), **kwargs: Any
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(f"{method} {self.base_url}{path}: {exc!r}") from exc
        if response.status_code not in ok:
            raise GatewayError(method, path, response.status_code, _detail(response))
        return response

    # -- resources ---------------------------------------------------------------------------------

    def list_resources(self) -> list[ResourceSummary]:
        """Every resource, by name, with its latest version and labels."""
        return [
            ResourceSummary.model_validate(item) for item in self._request("GET", "/api/resources").json()
        ]

    def push(self, name: str, push: ResourcePush) -> PushResult:
        """Push new content; `created` False when it equals the latest version's (nothing stored)."""
        body = push.model_dump(mode="json")
        response = self._request("POST", _resource_path(name), json=body, ok=(200, 201))
        return PushResult.model_validate(response.json())

    def history(self, name: str) -> list[ResourceVersion]:
        """The resource's versions, newest first."""
        answer = self._request("GET", f"{_resource_path(name)}/versions").json()
        return [ResourceVersion.model_validate(item) for item in answer]

    def version(self, name: str, selector: str | int) -> ResourceVersion:
        """One version, by number or by the label pointing at it."""
        answer = self._request("GET", f"{_resource_path(name)}/versions/{path_segment(str(selector))}")
        return ResourceVersion.model_validate(answer.json())

    def diff(self, name: str, old: str | int, new: str | int) -> ResourceDiff:
        """The unified diff from version (or label) `old` to `new`."""
        params = {"from": str(old), "to": str(new)}
        answer = self._request("GET", f"{_resource_path(name)}/diff", params=params).json()
        return ResourceDiff(
            name=name,
            old=_version_number(answer["from"]),
            new=_version_number(answer["to"]),
            diff=answer["diff"],
        )

    def labels(self, name: str) -> list[Label]:
        """The resource's labels, by label name."""
        answer = self._request("GET", f"{_resource_path(name)}/labels").json()
        return [Label.model_validate(item) for item in answer]

    def move_label(self, name: str, label: str, move: LabelMove) -> Label:
        """Point `label` at `move.version` (a compare-and-set when `move.expected` is given)."""
        path = f"{_resource_path(name)}/labels/{path_segment(label)}"
        response = self._request("PUT", path, json=move.model_dump(mode="json"), ok=(200, 201))
        return Label.model_validate(response.json())

    def stats(self, name: str, since: float | None = None, until: float | None = None) -> ResourceStats:
        """Per-version statistics of the rollouts created in `[since, until)` (None: unbounded)."""
        params = {
            key: repr(value) for key, value in (("since", since), ("until", until)) if value is not None
        }
        answer = self._request("GET", f"{_resource_path(name)}/stats", params=params)
        return ResourceStats.model_validate(answer.json())

    def rollout_resources(self, rollout_id: str) -> dict[str, dict[str, Any]]:
        """The versions recorded on a rollout: name -> `{"selector", "version"}` as the gateway answers."""
        return self._request("GET", f"/api/rollouts/{path_segment(rollout_id)}/resources").json()

    # -- audit log -----------------------------------------------------------------------------------

    def audit_page(self, after: int = 0, limit: int = AUDIT_PAGE) -> AuditPage:
        """Entries numbered `after+1 .. after+limit`, with the ledger's count and head hash."""
        answer = self._request("GET", "/api/audit", params={"after": str(after), "limit": str(limit)}).json()
        return AuditPage(
            items=[AuditEntry.model_validate(item) for item in answer["items"]],
            count=int(answer["count"]),
            head=str(answer["head"]),
        )

    def audit_pages(self, after: int = 0, limit: int = AUDIT_PAGE) -> Iterator[AuditPage]:
        """Every page after entry `after`, in order, until one comes back empty or short.

        Entries appended while paging are read too; the count of the last page is the one to
        compare, as it was read after the entries before it.
        """
        while True:
            page = self.audit_page(after, limit)
            yield page
            if len(page.items) < limit:
                return
            after = page.items[-1].seq


def _resource_path(name: str) -> str:
    return f"/api/resources/{path_segment(name)}"


def _version_number(value: Any) -> int:
    """A diff's `from` / `to`: a version number, or a version object carrying one."""
    return int(value["version"]) if isinstance(value, dict) else int(value)


def _detail(response: httpx.Response) -> str:
    """The gateway's `detail` text; a 422's list of problems as `loc: msg` pairs."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        problems = [
            f"{'.'.join(str(part) for part in item.get('loc', ()))}: {item.get('msg', '')}"
            for item in detail
            if isinstance(item, dict)
        ]
        return "; ".join(problems) or response.text[:300]
    if detail is not None:
        return str(detail)
    return response.text[:300]

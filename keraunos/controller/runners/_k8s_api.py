"""Every Kubernetes API call the runner makes, through kr8s (async), with errors turned into one type.

This module is the complete list of what the controller does to the cluster, which is what its
RBAC Role must allow (deploy/k8s/rbac.yaml): jobs create/get/list/watch/delete (group batch), pods
list, pods/log get. An answer the caller acts on comes back as a `KubeError` carrying the HTTP
status and the API's reason; a 403 is a `KubeForbidden` whose message names the missing permission.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from kr8s import ServerError
from kr8s._exceptions import APITimeoutError
from kr8s.asyncio import Api

from keraunos.errors import KeraunosError

#: (API group, version) of each resource the runner touches.
_GROUPS = {"jobs": ("batch", "batch/v1"), "pods": ("", "v1"), "pods/log": ("", "v1")}


class KubeError(KeraunosError):
    """A Kubernetes API call failed: `status` is the HTTP status (None: no answer), `reason` the
    API's reason (`AlreadyExists`, `Invalid`, `Expired`, ...)."""

    def __init__(self, verb: str, resource: str, status: int | None, reason: str, message: str) -> None:
        self.verb = verb
        self.resource = resource
        self.status = status
        self.reason = reason
        self.message = message
        code = f"{status} {reason}" if status is not None else reason
        super().__init__(f"{verb} {resource}: {code}: {message}")


class KubeForbidden(KubeError):
    """403: the controller's identity lacks an RBAC permission; the message names it."""

    def __init__(self, verb: str, resource: str, namespace: str, message: str) -> None:
        super().__init__(verb, resource, 403, "Forbidden", message)
        group = _GROUPS.get(resource, ("", ""))[0]
        self.permission = (
            f"verb '{verb}' on resource '{resource}' (apiGroup '{group}') in namespace '{namespace}'"
        )
        self.args = (
            f"the Kubernetes API refused to {verb} {resource} in namespace '{namespace}' (403 Forbidden: "
            f"{message}); the controller's service account needs the RBAC permission {self.permission} "
            "(see deploy/k8s/rbac.yaml)",
        )


def _status_of(exc: ServerError) -> tuple[int | None, str, str]:
    response = exc.response
    code = response.status_code if response is not None else None
    body = exc.status if isinstance(exc.status, dict) else {}
    reason = str(body.get("reason") or (response.reason_phrase if response is not None else "") or "Error")
    message = str(body.get("message") or exc)
    return code, reason, message


class KubeApi:
    """The runner's calls in one namespace, over a kr8s `Api`; `timeout_s` bounds each request."""

    def __init__(self, api: Api, namespace: str, *, timeout_s: float) -> None:
        self.api = api
        self.namespace = namespace
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def _errors(self, verb: str, resource: str) -> Iterator[None]:
        try:
            yield
        except ServerError as exc:
            status, reason, message = _status_of(exc)
            if status == 403:
                raise KubeForbidden(verb, resource, self.namespace, message) from None
            raise KubeError(verb, resource, status, reason, message) from None
        except (APITimeoutError, httpx.HTTPError, OSError) as exc:
            raise KubeError(verb, resource, None, "Unreachable", repr(exc)) from None

    async def _json(self, verb: str, resource: str, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        version = _GROUPS[resource][1]
        with self._errors(verb, resource):
            async with self.api.call_api(
                method, version=version, namespace=self.namespace, url=url, timeout=self.timeout_s, **kwargs
            ) as response:
                return response.json()

    async def create_job(self, job: dict[str, Any]) -> dict[str, Any]:
        """POST the Job; the created object."""
        return await self._json("create", "jobs", "POST", "jobs", content=json.dumps(job))

    async def get_job(self, name: str) -> dict[str, Any] | None:
        """The Job called `name`, or None when there is none."""
        try:
            return await self._json("get", "jobs", "GET", f"jobs/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete_job(self, name: str) -> bool:
        """Delete the Job and (in the background) its pods; False when it was already gone."""
        body = json.dumps({"propagationPolicy": "Background"})
        try:
            await self._json("delete", "jobs", "DELETE", f"jobs/{name}", content=body)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_jobs(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """The Jobs matching the label `selector` and the list's resourceVersion (to watch from)."""
        answer = await self._json("list", "jobs", "GET", "jobs", params={"labelSelector": selector})
        return list(answer.get("items") or []), str(
            (answer.get("metadata") or {}).get("resourceVersion") or ""
        )

    @contextlib.asynccontextmanager
    async def watch_jobs(
        self, selector: str, resource_version: str, *, server_timeout_s: float
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """A watch stream of the Jobs matching `selector` after `resource_version`: its events as
        dicts `{type, object}`. The server ends it after `server_timeout_s`; a stream silent for
        longer than that (plus a margin) is cut on this side."""
        params = {
            "watch": "true",
            "labelSelector": selector,
            "resourceVersion": resource_version,
            "timeoutSeconds": str(max(1, int(server_timeout_s))),
            "allowWatchBookmarks": "true",
        }
        timeout = httpx.Timeout(self.timeout_s, read=server_timeout_s * 1.5 + 1.0)
        with self._errors("watch", "jobs"):
            async with self.api.call_api(
                "GET",
                version="batch/v1",
                namespace=self.namespace,
                url="jobs",
                params=params,
                stream=True,
                timeout=timeout,
            ) as response:

                async def events() -> AsyncIterator[dict[str, Any]]:
                    with self._errors("watch", "jobs"):
                        async for line in response.aiter_lines():
                            if line.strip():
                                yield json.loads(line)

                yield events()

    async def list_pods(self, job_name: str) -> list[dict[str, Any]]:
        """The pods of a Job (label `job-name`)."""
        answer = await self._json(
            "list", "pods", "GET", "pods", params={"labelSelector": f"job-name={job_name}"}
        )
        return list(answer.get("items") or [])

    async def pod_log(self, pod_name: str, *, tail_lines: int) -> bytes:
        """The last `tail_lines` lines of a pod's (first container's) log."""
        with self._errors("get", "pods/log"):
            async with self.api.call_api(
                "GET",
                version="v1",
                namespace=self.namespace,
                url=f"pods/{pod_name}/log",
                params={"tailLines": str(tail_lines)},
                timeout=self.timeout_s,
            ) as response:
                return response.content

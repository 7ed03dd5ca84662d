"""The HTTP face of the stand-in: an ASGI app that serves the Kubernetes REST calls keraunos's runner
makes (keraunos/controller/runners/_k8s_api.py), plus the `/stand-in/` test controls. (`_serve.serve()`
runs it under uvicorn.)

Paths: `/version` (kr8s reads it when it connects), `/healthz`, `/livez`, `/readyz`,
`/apis/batch/v1/namespaces/NS/jobs[/NAME]`, `/api/v1/namespaces/NS/pods` and
`/api/v1/namespaces/NS/pods/NAME/log`. Query parameters: `labelSelector` on lists and watches;
`watch`, `resourceVersion`, `timeoutSeconds` and `allowWatchBookmarks` on watches; `tailLines` on logs.
The DELETE body's `propagationPolicy`. Errors are `Status` objects with the real server's codes and
reasons; a verb the runner does not use (PUT, PATCH, a Pod create, ...) is 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import orjson
import structlog

from kube_standin._api import KubeApi, visible_event
from kube_standin._config import StandInConfig
from kube_standin._controls import Controls, fault_error, fault_from_json
from kube_standin._kubelet import Kubelet
from kube_standin._objects import JOB, KINDS, POD, SERVER_VERSION, Kind
from kube_standin._selectors import parse_label_selector
from kube_standin._status import ApiError, failure_status
from kube_standin._store import Store

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = structlog.get_logger("keraunos.kube.server")
_JSON = [(b"content-type", b"application/json")]
_UNAUTHENTICATED = ("/version", "/healthz", "/livez", "/readyz")


@dataclass(frozen=True)
class Target:
    """What a resource path names: a collection (`name` None) or an object, maybe a subresource."""

    kind: Kind
    namespace: str
    name: str | None = None
    subresource: str = ""

    @property
    def resource(self) -> str:
        """`jobs`, `pods/log`: the resource as RBAC names it."""
        return f"{self.kind.plural}/{self.subresource}" if self.subresource else self.kind.plural


def resolve(path: str) -> Target:
    """The resource a REST path names; 404 NotFound for a path the server does not serve."""
    parts = [p for p in path.split("/") if p]
    missing = ApiError(404, "the server could not find the requested resource")
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:3] == ["apis", "batch", "v1"]:
        group, rest = "batch", parts[3:]
    else:
        raise missing
    if len(rest) < 3 or rest[0] != "namespaces" or len(rest) > 5:
        raise missing
    namespace, rest = rest[1], rest[2:]
    kind = KINDS.get((group, rest[0]))
    if kind is None:
        raise missing
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else ""
    if subresource and subresource not in dict(kind.subresources):
        raise missing
    return Target(kind, namespace, name, subresource)


def verb_of(method: str, target: Target, query: dict[str, str]) -> str:
    """The RBAC verb of a request (`get`, `list`, `watch`, `create`, ...)."""
    if method == "GET":
        if query.get("watch") in ("true", "1") and not target.subresource:
            return "watch"
        return "get" if target.name is not None else "list"
    if method == "DELETE":
        return "delete" if target.name is not None else "deletecollection"
    if method == "POST":
        return "create" if target.name is None else "post"
    return {"PUT": "update", "PATCH": "patch"}.get(method, method.lower())


class StandInApp:
    """The ASGI app: the API, its node (`kubelet`), the test controls and the open watches."""

    def __init__(self, config: StandInConfig, workdir: Path) -> None:
        self.config = config
        self.controls = Controls()
        self.open_watches = 0
        self._drops = 0  # bumped by a drop: watches opened before it end
        self._reset_drops = 0
        self._closing = False
        self._change = asyncio.Event()  # replaced (and set) at every change: watchers wait on it
        self.store = Store(config.history_size)
        self.api = KubeApi(
            self.store, namespaces=(config.namespace,), clock=time.time, rng=random.Random(config.seed)
        )
        self.kubelet = Kubelet(self.api, config, workdir)
        self.store.on_change = self._changed

    def _changed(self) -> None:
        change, self._change = self._change, asyncio.Event()
        change.set()
        self.kubelet.notify()

    def closing(self) -> None:
        """The server is stopping: end every open watch now."""
        self._closing = True
        self._changed()

    # --- ASGI --------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        query = dict(parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True))
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        if path.startswith("/stand-in/"):
            body = await _read_body(receive)
            code, answer = self._control(method, path, body)
            await _send_json(send, code, answer)
            return
        if path in ("/healthz", "/livez", "/readyz"):
            await _send(send, 200, b"ok", [(b"content-type", b"text/plain")])
            return
        token = self.config.token
        if token and path not in _UNAUTHENTICATED and headers.get("authorization") != f"Bearer {token}":
            await _send_json(send, 401, failure_status(401, "Unauthorized"))
            return
        if method == "GET" and path.rstrip("/") == "/version":
            await _send_json(send, 200, SERVER_VERSION)
            return
        body = await _read_body(receive)
        target: Target | None = None
        verb = ""
        try:
            target = resolve(path)
            verb = verb_of(method, target, query)
            if not target.kind.takes(verb, target.subresource) or (verb == "watch" and target.name):
                raise ApiError(
                    405, f"the server does not allow this method on the requested resource ({method})"
                )
            fault = self.controls.take_fault(verb, target.resource)
            if fault is not None:
                raise fault_error(fault, verb, target.resource, target.namespace, target.name)
            if verb == "watch":
                self.controls.record(verb, target.resource, target.namespace, target.name, 200)
                await self._watch(target, query, receive, send)
                return
            if target.subresource == "log":
                text = self._pod_log(target, query)
                self.controls.record(verb, target.resource, target.namespace, target.name, 200)
                await _send(send, 200, text.encode(), [(b"content-type", b"text/plain")])
                return
            code, answer = self._handle(verb, target, query, body)
        except ApiError as exc:
            if target is not None:
                self.controls.record(verb, target.resource, target.namespace, target.name, exc.code)
            extra = (
                [(b"retry-after", str(exc.details["retryAfterSeconds"]).encode())]
                if exc.code == 429 and exc.details
                else []
            )
            await _send(send, exc.code, orjson.dumps(exc.status()), _JSON + extra)
            return
        self.controls.record(verb, target.resource, target.namespace, target.name, code)
        await _send_json(send, code, answer)

    def _handle(
        self, verb: str, target: Target, query: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any]]:
        kind, namespace = target.kind, target.namespace
        if verb == "list":
            return 200, self.api.list(kind, namespace, label_selector=query.get("labelSelector", ""))
        if verb == "create":
            return 201, self.api.create(kind, namespace, _decode(body))
        assert target.name is not None
        if verb == "get":
            return 200, self.api.get(kind, namespace, target.name)
        assert verb == "delete"
        return 200, self.api.delete(kind, namespace, target.name, _delete_options(body))

    # --- watch -------------------------------------------------------------------------------------

    async def _watch(self, target: Target, query: dict[str, str], receive: Receive, send: Send) -> None:
        kind, namespace = target.kind, target.namespace
        labels = parse_label_selector(query.get("labelSelector", ""))
        timeout = _float_param(query, "timeoutSeconds", self.config.watch_timeout_seconds)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        since = query.get("resourceVersion", "")
        if not since.isdigit() or since == "0":
            # The API server would start such a watch with the current objects; keraunos always lists
            # first and watches from the list's resourceVersion, so the stand-in takes only that.
            raise ApiError(
                400,
                f'invalid resource version "{since}": the stand-in watches only from a list\'s resourceVersion',
            )
        cursor = int(since)
        drops, reset_drops = self._drops, self._reset_drops
        disconnected = asyncio.Event()

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()
            self._changed()

        listener = asyncio.get_running_loop().create_task(listen())
        self.open_watches += 1
        log.debug("watch opened", resource=kind.plural, namespace=namespace, since=since)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_JSON, (b"transfer-encoding", b"chunked")],
                }
            )
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.config.bookmark_interval_seconds
            while True:
                change = self._change
                try:
                    events = self.store.events_after(cursor)
                except ApiError as exc:
                    await send(
                        {
                            "type": "http.response.body",
                            "body": _line({"type": "ERROR", "object": exc.status()}),
                            "more_body": True,
                        }
                    )
                    break
                for event in events:
                    cursor = event.resource_version
                    visible = visible_event(event, kind, namespace, labels)
                    if visible is not None:
                        await send({"type": "http.response.body", "body": _line(visible), "more_body": True})
                if self._reset_drops != reset_drops:
                    log.info("watch reset by the test", resource=kind.plural)
                    return  # no final chunk: the client sees the connection break mid-stream
                now = time.monotonic()
                if disconnected.is_set() or self._closing or self._drops != drops or now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    mark = {
                        "kind": kind.kind,
                        "apiVersion": kind.api_version,
                        "metadata": {"resourceVersion": str(cursor)},
                    }
                    await send(
                        {
                            "type": "http.response.body",
                            "body": _line({"type": "BOOKMARK", "object": mark}),
                            "more_body": True,
                        }
                    )
                    next_bookmark = now + self.config.bookmark_interval_seconds
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(change.wait(), wait)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away while we were writing
            pass
        finally:
            self.open_watches -= 1
            listener.cancel()

    # --- logs --------------------------------------------------------------------------------------

    def _pod_log(self, target: Target, query: dict[str, str]) -> str:
        """The log of the Pod's container, its last `tailLines` lines if given. (No `container`
        parameter: a Pod of several containers is 400, as from the API server without one.)"""
        assert target.name is not None
        pod = self.api.get(POD, target.namespace, target.name)
        containers = [c["name"] for c in pod["spec"]["containers"]]
        if len(containers) > 1:
            raise ApiError(
                400,
                f"a container name must be specified for pod {target.name}, choose one of: [{' '.join(containers)}]",
            )
        path = self.kubelet.log_path(pod)
        if not path.exists():
            waiting = "ContainerCreating"
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                waiting = (status.get("state") or {}).get("waiting", {}).get("reason", waiting)
            raise ApiError(
                400, f'container "{containers[0]}" in pod "{target.name}" is waiting to start: {waiting}'
            )
        text = path.read_text(errors="replace")
        tail = _int_param(query, "tailLines", -1)
        if tail >= 0:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail else ""
        return text

    # --- test controls -----------------------------------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        try:
            data = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            return 400, {"error": "the body must be JSON"}
        route = (method, path.rstrip("/"))
        if route == ("GET", "/stand-in/requests"):
            return 200, self.controls.report()
        if route == ("DELETE", "/stand-in/requests"):
            self.controls.counts.clear()
            self.controls.recent.clear()
            return 200, {}
        if route == ("POST", "/stand-in/faults"):
            try:
                fault = fault_from_json(data)
            except ValueError as exc:
                return 400, {"error": str(exc)}
            self.controls.faults.append(fault)
            return 200, {"pending": self.controls.pending()}
        if route == ("GET", "/stand-in/faults"):
            return 200, {"pending": self.controls.pending()}
        if route == ("DELETE", "/stand-in/faults"):
            self.controls.faults.clear()
            return 200, {"pending": []}
        if route == ("POST", "/stand-in/watches/drop"):
            dropped = self.open_watches
            if data.get("reset"):
                self._reset_drops += 1
            else:
                self._drops += 1
            self._changed()
            return 200, {"dropped": dropped}
        if route == ("POST", "/stand-in/history/forget"):
            self.store.forget_history()
            return 200, {"compacted": self.store.compacted}
        if route == ("POST", "/stand-in/delete"):
            return self._delete_underneath(data)
        if route == ("GET", "/stand-in/state"):
            return 200, {
                "resourceVersion": self.store.resource_version,
                "compacted": self.store.compacted,
                "openWatches": self.open_watches,
                "processes": self.kubelet.processes(),
            }
        return 404, {"error": f"no control {method} {path}"}

    def _delete_underneath(self, data: dict[str, Any]) -> tuple[int, Any]:
        if not isinstance(data.get("name"), str):
            return 400, {"error": "give the name of the Job to delete"}
        try:
            result = self.api.delete(
                JOB,
                data.get("namespace", self.config.namespace),
                data["name"],
                {"propagationPolicy": "Background"},
            )
        except ApiError as exc:
            return exc.code, exc.status()
        return 200, result


def _line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event) + b"\n"


def _int_param(query: dict[str, str], name: str, default: int) -> int:
    value = query.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f'invalid value for {name}: "{value}" is not an integer') from None


def _float_param(query: dict[str, str], name: str, default: float) -> float:
    value = query.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError:
        raise ApiError(400, f'invalid value for {name}: "{value}" is not a number') from None


def _decode(body: bytes) -> Any:
    """A JSON request body (keraunos sends JSON; the stand-in reads no YAML or protobuf)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid body"
        raise ApiError(400, f"couldn't get version/kind; json parse error: {first}") from None


def _delete_options(body: bytes) -> dict[str, Any]:
    """The DeleteOptions in a DELETE's body (keraunos sends `{"propagationPolicy": "Background"}`)."""
    if not body.strip():
        return {}
    decoded = _decode(body)
    if not isinstance(decoded, dict):
        raise ApiError(400, "DeleteOptions must be a JSON object")
    return decoded


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


async def _send(send: Send, code: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, code: int, body: Any) -> None:
    await _send(send, code, orjson.dumps(body), _JSON)

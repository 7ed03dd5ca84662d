"""The resource versions a rollout was assigned, read by its agent (docs/agent-sdk.md#resources).

When a rollout is created with `resources` (`{"system_prompt": "candidate"}`), the gateway resolves
each selector to a version and records it on the rollout; the agent reads them with its own token
from `GET /api/rollouts/{rollout_id}/resources`, once per process and rollout (the assignment never
changes after creation, so the answer is cached). A gateway without that route (an Agent
Lightning v1.0 server, an older keraunos) answers the route itself with FastAPI's plain 404
`{"detail": "Not Found"}`, which reads as "no assignments": the agent falls back to its defaults.
A 404 naming the rollout (`Rollout not found: R`) is an error, as is any other refusal. The read is
idempotent, so transient failures are retried like event posts (`keraunos.agent._retry`).
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import httpx

from keraunos.agent._env import _EVENT_PATH, _PROXY_PATH, AgentEnv
from keraunos.agent._errors import NotInRolloutError, ResourceReadError
from keraunos.agent._retry import RetryPolicy, is_retryable, retry_delay

T = TypeVar("T")

#: What a 404 of a rollout the gateway does not know starts with (docs/protocol.md#errors).
ROLLOUT_NOT_FOUND = "Rollout not found"


@dataclass(frozen=True)
class AgentResource:
    """One resource version assigned to this rollout: a prompt's `content` is `{"template": ...}`."""

    name: str
    version: int
    kind: str
    content: dict[str, Any]


class _NoDefault:
    """The marker of `resource(name)` called without a default."""


_NO_DEFAULT = _NoDefault()

# Per process: (resources URL) -> the rollout's assignments as the gateway answered them ({} when
# the gateway has no such route). A forked agent starts with its parent's copy, which holds only
# rollouts the parent itself read, never the child's.
_cache: dict[str, dict[str, Any]] = {}
_cache_lock = threading.Lock()


def resources_url(env: AgentEnv) -> str:
    """`{server}/api/rollouts/{rollout_id}/resources`, the server taken from the event or proxy URL."""
    event_url = env.event_url.split("?", 1)[0]
    match = _EVENT_PATH.search(event_url)
    server = event_url[: match.start()] if match else None
    if server is None:
        proxy = _PROXY_PATH.search(env.openai_base_url)
        server = env.openai_base_url[: proxy.start()] if proxy else env.openai_base_url
    return f"{server}/api/rollouts/{env.rollout_id}/resources"


def _headers(env: AgentEnv) -> dict[str, str]:
    return {"Authorization": f"Bearer {env.key}"} if env.key else {}


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body["detail"]) if isinstance(body, dict) and "detail" in body else response.text[:200]


def _verdict(
    env: AgentEnv, retry: RetryPolicy, answer: httpx.Response | httpx.TransportError, tries: int
) -> tuple[dict[str, Any] | None, float]:
    """`(assignments, 0)` when the read is done, `(None, delay)` to try again; raises
    `ResourceReadError` for a final refusal or when the tries are used up."""
    if isinstance(answer, httpx.TransportError):
        status, detail, retry_after = None, f"{type(answer).__name__}: {answer}", None
    elif answer.is_success:
        body = answer.json()
        if not isinstance(body, dict):
            raise ResourceReadError(
                f"the gateway's resources of rollout {env.rollout_id} are not a JSON object",
                status=200,
                detail="",
            )
        return body, 0.0
    else:
        status, detail, retry_after = answer.status_code, _detail(answer), answer.headers.get("retry-after")
        if status == 404 and not detail.startswith(ROLLOUT_NOT_FOUND):
            return {}, 0.0  # the route itself is missing: a gateway without resources
    if not is_retryable(status) or tries == retry.attempts:
        where = f"rollout {env.rollout_id} attempt {env.attempt_id}"
        said = f"({status}" + (f" after {tries} tries" if is_retryable(status) else "") + ")"
        raise ResourceReadError(
            f"could not read the resources of {where} from {resources_url(env)} {said}: {detail}",
            status=status,
            detail=detail,
        )
    return None, retry_delay(retry, tries, retry_after)


def _pick(assignments: dict[str, Any], name: str) -> AgentResource | None:
    entry = assignments.get(name)
    if entry is None:
        return None
    version = entry["version"] if isinstance(entry, dict) and "version" in entry else entry
    return AgentResource(
        name=str(version.get("name", name)),
        version=int(version["version"]),
        kind=str(version["kind"]),
        content=copy.deepcopy(version["content"]),  # the cached answer stays as the gateway sent it
    )


def _environment() -> AgentEnv | None:
    try:
        return AgentEnv.read()
    except NotInRolloutError:
        return None


def _fetch(env: AgentEnv, retry: RetryPolicy) -> dict[str, Any]:
    url = resources_url(env)
    with _cache_lock:
        if url in _cache:
            return _cache[url]
    with httpx.Client(timeout=retry.timeout_s) as http:
        for tries in range(1, retry.attempts + 1):
            try:
                answer: httpx.Response | httpx.TransportError = http.get(url, headers=_headers(env))
            except httpx.TransportError as exc:
                answer = exc
            assignments, delay = _verdict(env, retry, answer, tries)
            if assignments is not None:
                with _cache_lock:
                    return _cache.setdefault(url, assignments)
            time.sleep(delay)
    raise AssertionError("unreachable: the last try returns or raises")


async def _afetch(env: AgentEnv, retry: RetryPolicy) -> dict[str, Any]:
    url = resources_url(env)
    if url in _cache:
        return _cache[url]
    async with httpx.AsyncClient(timeout=retry.timeout_s) as http:
        for tries in range(1, retry.attempts + 1):
            try:
                answer: httpx.Response | httpx.TransportError = await http.get(url, headers=_headers(env))
            except httpx.TransportError as exc:
                answer = exc
            assignments, delay = _verdict(env, retry, answer, tries)
            if assignments is not None:
                with _cache_lock:
                    return _cache.setdefault(url, assignments)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: the last try returns or raises")


@overload
def resource(name: str) -> AgentResource | None: ...
@overload
def resource(name: str, default: T) -> AgentResource | T: ...
def resource(name: str, default: Any = _NO_DEFAULT) -> Any:
    """The version of resource `name` this rollout was assigned, or `default` (None when not given)
    when it was assigned none or the gateway has no resources.

    Outside a rollout raises `NotInRolloutError`, unless a default is given (then returns it).
    Raises `ResourceReadError` when the gateway refuses the read (an unknown rollout, a superseded
    attempt) or keeps failing it.
    """
    env = _environment()
    if env is None:
        if isinstance(default, _NoDefault):
            AgentEnv.read()  # raises NotInRolloutError naming what is missing
        return default
    found = _pick(_fetch(env, RetryPolicy()), name)
    if found is not None:
        return found
    return None if isinstance(default, _NoDefault) else default


@overload
async def aresource(name: str) -> AgentResource | None: ...
@overload
async def aresource(name: str, default: T) -> AgentResource | T: ...
async def aresource(name: str, default: Any = _NO_DEFAULT) -> Any:
    """`resource` for asyncio code."""
    env = _environment()
    if env is None:
        if isinstance(default, _NoDefault):
            AgentEnv.read()
        return default
    found = _pick(await _afetch(env, RetryPolicy()), name)
    if found is not None:
        return found
    return None if isinstance(default, _NoDefault) else default

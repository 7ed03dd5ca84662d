"""Watches of the stand-in, as the runner opens them: newline-delimited events after a list's
resourceVersion, 410 Expired for one older than the kept history, timeouts, bookmarks and drops."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

from keraunos.controller.runners._k8s_api import KubeApi

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def sleeping_job(name: str, **labels: str) -> dict[str, Any]:
    return job_manifest(name, shell("exec sleep 60"), labels={"test": name, **labels})


def list_version(kube: KubeStandIn) -> str:
    with kube.client() as client:
        return client.get(JOBS, params={"labelSelector": "none=here"}).json()["metadata"]["resourceVersion"]


def read_watch(
    kube: KubeStandIn, params: dict[str, Any], until: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """The events of one watch request until `until(event)` holds or the server ends the stream."""
    events = []
    with kube.client() as client, client.stream("GET", JOBS, params={"watch": "true", **params}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            events.append(json.loads(line))
            if until is not None and until(events[-1]):
                break
    return events


async def test_a_watch_from_a_lists_resource_version_streams_every_later_change_in_order(
    runner_api: KubeApi,
) -> None:
    name = unique_name()
    _, since = await runner_api.list_jobs(f"test={name}")
    await runner_api.create_job(sleeping_job(name))
    await runner_api.create_job(sleeping_job(unique_name()))  # another selector: not seen
    await runner_api.delete_job(name)

    seen: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with runner_api.watch_jobs(f"test={name}", since, server_timeout_s=10) as events:
            async for event in events:
                seen.append(event)
                if event["type"] == "DELETED":
                    break

    types = [event["type"] for event in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and set(types[1:-1]) <= {"MODIFIED"}
    assert {event["object"]["metadata"]["name"] for event in seen} == {name}
    versions = [int(event["object"]["metadata"]["resourceVersion"]) for event in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert min(versions) > int(since)


@pytest.mark.parametrize("params", [{}, {"resourceVersion": "0"}, {"resourceVersion": "x"}])
def test_a_watch_not_from_a_lists_resource_version_is_400(kube: KubeStandIn, params: dict[str, str]) -> None:
    with kube.client() as client:
        response = client.get(JOBS, params={"watch": "true", **params})

    assert response.status_code == 400 and response.json()["reason"] == "BadRequest"


def test_a_watch_of_one_object_path_is_not_served(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.get(f"{JOBS}/any", params={"watch": "true", "resourceVersion": list_version(kube)})

    assert response.status_code == 405


def test_a_watch_from_a_forgotten_resource_version_gets_an_error_event_with_410_expired(
    kube: KubeStandIn,
) -> None:
    since = list_version(kube)
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(unique_name())).raise_for_status()
    kube.controls.forget_history()

    [event] = read_watch(kube, {"resourceVersion": since})

    assert event["type"] == "ERROR"
    status = event["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    assert status["message"].startswith(f"too old resource version: {since} (")
    current = list_version(kube)  # a fresh list gives a resourceVersion to watch from again
    assert read_watch(kube, {"resourceVersion": current, "timeoutSeconds": 0.2}) == []


def test_timeout_seconds_ends_the_stream(kube: KubeStandIn) -> None:
    since = list_version(kube)
    started = time.monotonic()

    assert (
        read_watch(kube, {"resourceVersion": since, "labelSelector": "none=here", "timeoutSeconds": 0.5})
        == []
    )
    assert 0.5 <= time.monotonic() - started < 5


def test_bookmarks_carry_the_resource_version_when_asked_for(kube: KubeStandIn) -> None:
    # The shared stand-in sends a bookmark every 0.2 s (conftest).
    events = read_watch(
        kube, {"resourceVersion": list_version(kube), "allowWatchBookmarks": "true", "timeoutSeconds": 0.5}
    )

    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["object"]["kind"] == "Job" and events[0]["object"]["metadata"]["resourceVersion"]


async def drop_during_a_watch(kube: KubeStandIn, *, reset: bool) -> tuple[int, str]:
    """Open a watch, drop the open watches, and say how many were dropped and how the watch ended."""
    params = {"watch": "true", "resourceVersion": list_version(kube), "labelSelector": "none=here"}
    opened = anyio.Event()
    outcome: list[str] = []
    dropped = 0

    async def watch() -> None:
        async with httpx.AsyncClient(base_url=kube.base_url, headers=kube.headers, verify=False) as client:
            try:
                async with client.stream("GET", JOBS, params={**params, "timeoutSeconds": 30}) as response:
                    opened.set()  # the server counts a watch as open before it sends the headers
                    async for _ in response.aiter_lines():
                        pass
            except httpx.RemoteProtocolError:
                outcome.append("broken")
                return
        outcome.append("ended")

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await opened.wait()
            dropped = await anyio.to_thread.run_sync(lambda: kube.controls.drop_watches(reset=reset))
    return dropped, outcome[0]


async def test_dropped_watches_end_cleanly_or_break_mid_stream(kube: KubeStandIn) -> None:
    dropped, outcome = await drop_during_a_watch(kube, reset=False)
    assert dropped >= 1 and outcome == "ended"

    dropped, outcome = await drop_during_a_watch(kube, reset=True)
    assert dropped >= 1 and outcome == "broken"

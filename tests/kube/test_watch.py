"""Watches of the stand-in: newline-delimited events after a resourceVersion, selector transitions,
410 Expired for a resourceVersion older than the kept history, timeouts, bookmarks and drops."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Job
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def sleeping_job(name: str, **labels: str) -> dict[str, Any]:
    return job_manifest(name, shell("exec sleep 60"), labels={"test": name, **labels})


def list_version(kube: KubeStandIn) -> str:
    with kube.client() as client:
        return client.get(JOBS, params={"limit": 1}).json()["metadata"]["resourceVersion"]


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


async def test_a_watch_from_a_resource_version_streams_every_later_change_in_order(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    name = unique_name()
    since = list_version(kube)
    job = await Job(sleeping_job(name), api=kr8s_api)
    await job.create()
    await job.label(stage="two")
    await job.delete(propagation_policy="Background")

    seen: list[tuple[str, Any]] = []
    with anyio.fail_after(10):
        async for event_type, obj in kr8s_api.watch("jobs", label_selector={"test": name}, since=since):
            seen.append((event_type, obj))
            if event_type == "DELETED":
                break

    types = [event_type for event_type, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED" and set(types[1:-1]) == {"MODIFIED"}
    versions = [int(obj.metadata["resourceVersion"]) for _, obj in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert any(obj.labels.get("stage") == "two" for _, obj in seen)


def test_a_watch_without_a_resource_version_starts_with_the_current_objects(kube: KubeStandIn) -> None:
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(name)).raise_for_status()

    events = read_watch(kube, {"labelSelector": f"test={name}", "timeoutSeconds": 5}, until=lambda e: True)

    assert [(e["type"], e["object"]["metadata"]["name"], e["object"]["kind"]) for e in events] == [
        ("ADDED", name, "Job")
    ]
    with kube.client() as client:
        client.delete(f"{JOBS}/{name}", params={"propagationPolicy": "Background"}).raise_for_status()


def test_an_object_that_starts_or_stops_matching_the_selector_arrives_as_added_or_deleted(
    kube: KubeStandIn,
) -> None:
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(name, watched="no")).raise_for_status()
        since = client.get(f"{JOBS}/{name}").json()["metadata"]["resourceVersion"]
        for value in ("yes", "no"):
            client.patch(
                f"{JOBS}/{name}",
                json={"metadata": {"labels": {"watched": value}}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

    events = read_watch(
        kube,
        {"labelSelector": f"test={name},watched=yes", "resourceVersion": since},
        until=lambda e: e["type"] == "DELETED",
    )

    seen = [(e["type"], e["object"]["metadata"]["labels"]["watched"]) for e in events]
    assert seen[0] == ("ADDED", "yes") and seen[-1] == ("DELETED", "no")
    assert set(seen[1:-1]) <= {("MODIFIED", "yes")}  # the Job controller may write its status meanwhile
    with kube.client() as client:
        client.delete(f"{JOBS}/{name}", params={"propagationPolicy": "Background"}).raise_for_status()


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


def test_watch_true_on_an_object_path_watches_that_object(kube: KubeStandIn) -> None:
    name, other = unique_name(), unique_name()
    with kube.client() as client:
        for job in (name, other):
            client.post(JOBS, json=sleeping_job(job)).raise_for_status()
        with client.stream(
            "GET", f"{JOBS}/{name}", params={"watch": "true", "timeoutSeconds": 5}
        ) as response:
            first = json.loads(next(response.iter_lines()))
        for job in (name, other):
            client.delete(f"{JOBS}/{job}", params={"propagationPolicy": "Background"}).raise_for_status()

    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", name)

"""Everything the stand-in serves is a valid object of the official `kubernetes` client's models, and
survives a round trip through them with no field lost, so a client is not tuned to a fake."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from kube_standin import KubeStandIn
from kube_support import final_condition, job_manifest, shell, unique_name
from kubernetes.client import ApiClient

JOBS = "/apis/batch/v1/namespaces/default/jobs"
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\+00:00|Z)")


def normalised(value: Any) -> Any:
    """Nulls dropped and timestamps in one spelling (the client writes `+00:00` for `Z`)."""
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, str) and _TIMESTAMP.fullmatch(value):
        return value.replace("+00:00", "Z")
    return value


def round_trip(data: dict[str, Any], model: str) -> dict[str, Any]:
    """`data` deserialised into `model` (validating it) and serialised back."""
    client = ApiClient()
    return client.sanitize_for_serialization(client._ApiClient__deserialize(data, model))  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def finished_jobs(kube: KubeStandIn) -> dict[str, str]:
    """A Job that succeeded and one that failed (with env, field refs, TTL and deadline set)."""
    names = {"succeeded": unique_name("ok"), "failed": unique_name("bad")}
    env = [
        {"name": "A", "value": "1"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    with kube.client() as client:
        for outcome, name in names.items():
            script = "echo done" if outcome == "succeeded" else "echo broken >&2; exit 2"
            manifest = job_manifest(
                name, shell(script), env=env, ttlSecondsAfterFinished=600, activeDeadlineSeconds=30
            )
            client.post(JOBS, json=manifest).raise_for_status()
        deadline = time.monotonic() + 10
        for name in names.values():
            while not final_condition(client.get(f"{JOBS}/{name}").json()):
                assert time.monotonic() < deadline, f"Job {name} did not finish"
                time.sleep(0.05)
    return names


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/version", "VersionInfo"),
        (f"{JOBS}/{{succeeded}}", "V1Job"),
        (f"{JOBS}/{{failed}}", "V1Job"),
        (JOBS, "V1JobList"),
        ("/api/v1/namespaces/default/pods", "V1PodList"),
        (f"{JOBS}/no-such-job", "V1Status"),
    ],
)
def test_served_objects_deserialise_into_the_official_models_without_losing_a_field(
    kube: KubeStandIn, finished_jobs: dict[str, str], path: str, model: str
) -> None:
    with kube.client() as client:
        data = client.get(path.format(**finished_jobs)).json()

    assert normalised(round_trip(data, model)) == normalised(data)


def test_job_and_pod_statuses_read_back_through_the_models(
    kube: KubeStandIn, finished_jobs: dict[str, str]
) -> None:
    client = ApiClient()
    with kube.client() as http:
        job = client._ApiClient__deserialize(http.get(f"{JOBS}/{finished_jobs['failed']}").json(), "V1Job")  # type: ignore[attr-defined]
        pods = client._ApiClient__deserialize(  # type: ignore[attr-defined]
            http.get(
                "/api/v1/namespaces/default/pods",
                params={"labelSelector": f"job-name={finished_jobs['failed']}"},
            ).json(),
            "V1PodList",
        )

    assert job.spec.backoff_limit == 0 and job.spec.ttl_seconds_after_finished == 600
    assert job.status.failed == 1 and job.status.start_time is not None
    assert [(c.type, c.reason) for c in job.status.conditions][-1] == ("Failed", "BackoffLimitExceeded")
    [pod] = pods.items
    assert pod.metadata.owner_references[0].uid == job.metadata.uid
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 2
    assert [e.name for e in pod.spec.containers[0].env] == ["A", "POD"]


def test_watch_events_and_delete_answers_deserialise_too(kube: KubeStandIn) -> None:
    name = unique_name()
    client = ApiClient()
    with kube.client() as http:
        since = http.get(JOBS, params={"labelSelector": f"test={name}"}).json()["metadata"]["resourceVersion"]
        http.post(JOBS, json=job_manifest(name, shell("exec sleep 60"))).raise_for_status()
        deleted = http.request("DELETE", f"{JOBS}/{name}", json={"propagationPolicy": "Background"}).json()
        params = {
            "watch": "true",
            "resourceVersion": since,
            "labelSelector": f"test={name}",
            "timeoutSeconds": 5,
            "allowWatchBookmarks": "true",
        }
        with http.stream("GET", JOBS, params=params) as response:
            events = []
            for line in response.iter_lines():
                events.append(json.loads(line))
                if events[-1]["type"] == "DELETED":
                    break

    status = client._ApiClient__deserialize(deleted, "V1Status")  # type: ignore[attr-defined]
    assert status.status == "Success" and status.details.name == name
    for event in events:
        assert client._ApiClient__deserialize(event, "V1WatchEvent").type == event["type"]  # type: ignore[attr-defined]
        if event["type"] != "BOOKMARK":
            assert normalised(round_trip(event["object"], "V1Job")) == normalised(event["object"])

"""The stand-in's pure core: store and history, selectors, the Job controller's decisions, container
environments, path resolution and the one deletion policy."""

from __future__ import annotations

import random
from typing import Any

import pytest
from kube_standin._api import KubeApi, rfc3339, visible_event
from kube_standin._containers import (
    ContainerConfigError,
    container_argv,
    container_environment,
    expand,
)
from kube_standin._jobs import JobMemory, plan_job, pod_for_job
from kube_standin._objects import JOB, POD
from kube_standin._selectors import labels_match, parse_label_selector
from kube_standin._server import resolve
from kube_standin._status import ApiError
from kube_standin._store import Store

from keraunos.controller.runners._k8s_render import selector


def new_api(history: int = 100) -> KubeApi:
    return KubeApi(Store(history), clock=lambda: 1_800_000_000.0, rng=random.Random(0))


def job_body(name: str, **labels: str) -> dict[str, Any]:
    container = {"name": "c", "image": "i:1", "command": ["true"]}
    return {
        "metadata": {"name": name, "labels": labels or {"a": "b"}},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def test_every_write_takes_the_next_global_resource_version() -> None:
    api = new_api()
    first = api.create(JOB, "default", job_body("one"))
    second = api.create(JOB, "default", job_body("two"))

    assert int(second["metadata"]["resourceVersion"]) == int(first["metadata"]["resourceVersion"]) + 1
    assert [e.type for e in api.store.events_after(1)] == ["ADDED", "ADDED"]


def test_a_list_of_an_empty_store_is_not_resource_version_0_which_a_watch_reads_as_any() -> None:
    assert new_api().list(JOB, "default")["metadata"]["resourceVersion"] == "1"


def test_the_store_keeps_only_history_size_events_and_older_versions_expire() -> None:
    api = new_api(history=2)
    for name in ("a", "b", "c", "d"):
        api.create(JOB, "default", job_body(name))

    assert [e.object["metadata"]["name"] for e in api.store.events_after(3)] == ["c", "d"]
    with pytest.raises(ApiError) as raised:
        api.store.events_after(2)
    assert raised.value.code == 410 and raised.value.reason == "Expired"


def test_objects_leave_the_store_as_copies() -> None:
    api = new_api()
    api.create(JOB, "default", job_body("one"))
    api.get(JOB, "default", "one")["metadata"]["labels"]["a"] = "changed"

    assert api.get(JOB, "default", "one")["metadata"]["labels"]["a"] == "b"


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b,c=d", {"a": "b"}, False),
        ("a=b,c=", {"a": "b", "c": ""}, True),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("a=b,", {"a": "b"}, True),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors_match_like_the_api_servers(
    selector: str, labels: dict[str, str], expected: bool
) -> None:
    assert labels_match(parse_label_selector(selector), {"metadata": {"labels": labels}}) is expected


def test_the_runners_selector_is_taken_as_it_sends_it() -> None:
    requirements = parse_label_selector(selector("hostile"))
    job = {
        "metadata": {
            "labels": {"app.kubernetes.io/managed-by": "keraunos", "keraunos.dev/instance": "hostile"}
        }
    }

    assert labels_match(requirements, job)
    assert not labels_match(
        requirements, {"metadata": {"labels": {"app.kubernetes.io/managed-by": "keraunos"}}}
    )


@pytest.mark.parametrize("selector", ["a=(b", "a in (b)", "!a", "a", "bad key!=x", "a=" + "v" * 64])
def test_a_bad_or_set_based_label_selector_is_400(selector: str) -> None:
    with pytest.raises(ApiError) as raised:
        parse_label_selector(selector)
    assert raised.value.code == 400


def pod(uid: str, phase: str, **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": f"p-{uid}", **metadata}, "status": {"phase": phase}}


def test_the_job_controller_creates_a_pod_then_completes_when_it_succeeded() -> None:
    api = new_api()
    job = api.create(JOB, "default", job_body("j"))
    memory = JobMemory()

    start = plan_job(job, [], memory, 100.0, retry_backoff=1.0)
    assert start.create_pods == 1 and start.status["startTime"] == rfc3339(100.0)
    job["status"] = start.status
    done = plan_job(job, [pod("1", "Succeeded")], memory, 101.0, retry_backoff=1.0)

    assert [c["type"] for c in done.status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert done.status["succeeded"] == 1 and done.create_pods == 0


def test_the_job_controller_waits_for_backoff_before_replacing_a_failed_pod_and_fails_past_the_limit() -> (
    None
):
    api = new_api()
    body = job_body("j")
    body["spec"]["backoffLimit"] = 1
    job = api.create(JOB, "default", body)
    memory = JobMemory()

    job["status"] = plan_job(job, [pod("1", "Failed")], memory, 100.0, retry_backoff=1.0).status
    assert job["status"]["failed"] == 1
    waiting = plan_job(job, [pod("1", "Failed")], memory, 100.5, retry_backoff=1.0)
    assert waiting.create_pods == 0 and waiting.wake_at == 101.0
    assert plan_job(job, [pod("1", "Failed")], memory, 101.0, retry_backoff=1.0).create_pods == 1
    failed = plan_job(job, [pod("1", "Failed"), pod("2", "Failed")], memory, 102.0, retry_backoff=1.0)
    assert failed.status["failed"] == 2
    assert [(c["type"], c["reason"]) for c in failed.status["conditions"]] == [
        ("FailureTarget", "BackoffLimitExceeded"),
        ("Failed", "BackoffLimitExceeded"),
    ]


def test_past_the_deadline_the_job_stops_its_pods_and_fails_only_once_they_are_gone() -> None:
    api = new_api()
    body = job_body("j")
    body["spec"]["activeDeadlineSeconds"] = 5
    job = api.create(JOB, "default", body)
    memory = JobMemory()
    job["status"] = plan_job(job, [], memory, 100.0, retry_backoff=1.0).status

    running = plan_job(job, [pod("1", "Running")], memory, 105.0, retry_backoff=1.0)
    assert running.delete_pods == ["p-1"]
    assert [c["type"] for c in running.status["conditions"]] == ["FailureTarget"]
    job["status"] = running.status
    stopped = plan_job(job, [pod("1", "Failed", deletionTimestamp="x")], memory, 106.0, retry_backoff=1.0)
    assert stopped.status["conditions"][-1]["type"] == "Failed"
    assert stopped.status["conditions"][-1]["reason"] == "DeadlineExceeded"


def test_a_pod_removed_before_it_finished_counts_as_failed() -> None:
    api = new_api()
    job = api.create(JOB, "default", job_body("j"))
    memory = JobMemory()
    job["status"] = plan_job(job, [pod("1", "Running")], memory, 100.0, retry_backoff=1.0).status

    gone = plan_job(job, [], memory, 101.0, retry_backoff=1.0)

    assert gone.status["failed"] == 1 and gone.status["conditions"][-1]["type"] == "Failed"


def test_ttl_after_finished_expires_the_job() -> None:
    api = new_api()
    body = job_body("j")
    body["spec"]["ttlSecondsAfterFinished"] = 10
    job = api.create(JOB, "default", body)
    memory = JobMemory()
    job["status"] = plan_job(job, [pod("1", "Succeeded")], memory, 100.0, retry_backoff=1.0).status

    assert plan_job(job, [pod("1", "Succeeded")], memory, 105.0, retry_backoff=1.0).wake_at == 110.0
    assert plan_job(job, [pod("1", "Succeeded")], memory, 110.0, retry_backoff=1.0).remove_job


def test_container_env_expands_references_and_resolves_field_refs() -> None:
    the_pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"rollout": "r-1"}}, "spec": {}}
    container = {
        "name": "c",
        "command": ["run", "$(A)", "$$(A)"],
        "args": ["--x=$(UNDEFINED)"],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-2"},
            {"name": "R", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rollout']"}}},
        ],
    }
    env = container_environment(the_pod, container)

    assert env == {"HOSTNAME": "p", "A": "1", "B": "1-2", "R": "r-1"}
    assert container_argv(container, env) == ["run", "1", "$(A)", "--x=$(UNDEFINED)"]
    assert expand("$$", {}) == "$"


def test_secret_refs_cannot_be_resolved() -> None:
    container = {
        "name": "c",
        "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    with pytest.raises(ContainerConfigError, match="secretKeyRef"):
        container_environment({"metadata": {"name": "p"}, "spec": {}}, container)


def test_a_watcher_sees_the_events_of_its_kind_namespace_and_labels_only() -> None:
    api = new_api()
    api.create(JOB, "default", job_body("other", watched="no"))
    api.create(JOB, "default", job_body("seen", watched="yes"))
    labels = parse_label_selector("watched=yes")

    events = [visible_event(e, JOB, "default", labels) for e in api.store.events_after(1)]

    assert [e and (e["type"], e["object"]["metadata"]["name"]) for e in events] == [None, ("ADDED", "seen")]
    assert [visible_event(e, POD, "default", ()) for e in api.store.events_after(1)] == [None, None]


@pytest.mark.parametrize(
    ("path", "resource", "namespace", "name"),
    [
        ("/apis/batch/v1/namespaces/ns/jobs", "jobs", "ns", None),
        ("/apis/batch/v1/namespaces/ns/jobs/j", "jobs", "ns", "j"),
        ("/api/v1/namespaces/ns/pods", "pods", "ns", None),
        ("/api/v1/namespaces/ns/pods/p/log", "pods/log", "ns", "p"),
    ],
)
def test_rest_paths_resolve_to_their_resource(
    path: str, resource: str, namespace: str | None, name: str | None
) -> None:
    target = resolve(path)
    assert (target.resource, target.namespace, target.name) == (resource, namespace, name)


@pytest.mark.parametrize(
    "path",
    [
        "/apis/apps/v1/namespaces/ns/deployments",
        "/api/v1/namespaces/ns/pods/p/exec",
        "/api/v1/namespaces/ns/pods/p/status",
        "/apis/batch/v1/jobs",
        "/api/v1/namespaces",
        "/api/v2/pods",
    ],
)
def test_paths_it_does_not_serve_are_404(path: str) -> None:
    with pytest.raises(ApiError) as raised:
        resolve(path)
    assert raised.value.code == 404


def test_a_background_delete_removes_the_job_then_stops_its_running_pod_gracefully() -> None:
    api = new_api()
    job = api.create(JOB, "default", job_body("j"))
    pod_name = api.create(POD, "default", pod_for_job(job))["metadata"]["name"]
    running = api.get(POD, "default", pod_name)
    running["spec"]["nodeName"], running["status"]["phase"] = "node", "Running"
    api.write(POD, running)
    since = api.store.resource_version

    answer = api.delete(JOB, "default", "j", {"propagationPolicy": "Background"})

    assert answer["status"] == "Success" and answer["details"]["name"] == "j"
    assert [(e.type, e.plural) for e in api.store.events_after(since)] == [
        ("DELETED", "jobs"),
        ("MODIFIED", "pods"),
    ]
    assert "deletionTimestamp" in api.get(POD, "default", pod_name)["metadata"]  # the kubelet stops it


@pytest.mark.parametrize(
    "options", [{}, {"propagationPolicy": "Orphan"}, {"propagationPolicy": "Foreground"}]
)
def test_any_other_propagation_policy_is_422_as_the_stand_in_implements_only_background(
    options: dict[str, Any],
) -> None:
    api = new_api()
    api.create(JOB, "default", job_body("j"))

    with pytest.raises(ApiError) as raised:
        api.delete(JOB, "default", "j", options)

    assert raised.value.code == 422 and "Background" in raised.value.message
    assert api.get(JOB, "default", "j")["metadata"]["name"] == "j"

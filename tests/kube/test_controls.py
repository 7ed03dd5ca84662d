"""The stand-in's test controls, as the Kubernetes runner's tests use them: injected failures with
real-looking Status bodies, request counts, and deleting a Job underneath a client."""

from __future__ import annotations

import pytest
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

from keraunos.controller.runners._k8s_api import KubeApi, KubeForbidden

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


async def test_an_injected_403_reads_like_missing_rbac_and_is_used_up(
    kube: KubeStandIn, runner_api: KubeApi
) -> None:
    kube.controls.fail_next("create", "jobs", 403, count=4)  # kr8s re-authenticates 3 times on 401/403
    manifest = job_manifest(unique_name(), shell("true"))

    with pytest.raises(KubeForbidden) as raised:
        await runner_api.create_job(manifest)

    assert raised.value.message == (
        'jobs.batch is forbidden: User "system:serviceaccount:default:keraunos-controller" cannot create '
        'resource "jobs" in API group "batch" in the namespace "default"'
    )
    assert kube.controls.pending_faults() == []
    await runner_api.create_job(manifest)  # the fault is used up
    await runner_api.delete_job(manifest["metadata"]["name"])


def test_an_injected_429_carries_retry_after_and_other_verbs_are_untouched(kube: KubeStandIn) -> None:
    kube.controls.fail_next("list", "jobs", 429, retry_after_seconds=2)
    with kube.client() as client:
        assert client.get(f"{JOBS}/not-there").status_code == 404  # a get is not a list
        limited = client.get(JOBS)
        after = client.get(JOBS)

    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert limited.json()["reason"] == "TooManyRequests"
    assert limited.json()["details"]["retryAfterSeconds"] == 2
    assert after.status_code == 200


def test_requests_are_counted_by_verb_and_resource(kube: KubeStandIn) -> None:
    kube.controls.reset_requests()
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=job_manifest(name, shell("exec sleep 60"))).raise_for_status()
        client.get(f"{JOBS}/{name}")
        client.get(JOBS, params={"labelSelector": f"test={name}"})
        client.get("/api/v1/namespaces/default/pods")
        client.request("DELETE", f"{JOBS}/{name}", json={"propagationPolicy": "Background"})

    assert kube.controls.requests() == {
        "create jobs": 1,
        "get jobs": 1,
        "list jobs": 1,
        "list pods": 1,
        "delete jobs": 1,
    }
    [create] = [r for r in kube.controls.request_log() if r["verb"] == "create"]
    assert create["name"] is None and create["namespace"] == "default" and create["code"] == 201


async def test_a_job_deleted_underneath_is_gone_with_its_pods_and_the_delete_is_not_counted(
    kube: KubeStandIn, runner_api: KubeApi
) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("exec sleep 60")))
    kube.controls.reset_requests()

    kube.controls.delete_underneath(name)

    assert kube.controls.count("delete", "jobs") == 0
    assert await runner_api.get_job(name) is None


def test_a_bad_fault_is_refused_with_a_reason(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.post("/stand-in/faults", json={"verb": "explode", "resource": "jobs", "code": 500})

    assert response.status_code == 400 and "verb must be one of" in response.json()["error"]

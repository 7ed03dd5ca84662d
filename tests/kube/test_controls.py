"""The stand-in's test controls, as the Kubernetes runner's tests use them: injected failures with
real-looking Status bodies, request counts, and deleting a Job underneath a client."""

from __future__ import annotations

import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Job
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


async def test_an_injected_403_reads_like_missing_rbac_and_is_used_up(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    kube.controls.fail_next("create", "jobs", 403, count=4)  # kr8s re-authenticates 3 times on 401/403
    job = await Job(job_manifest(unique_name(), shell("true")), api=kr8s_api)

    with pytest.raises(kr8s.ServerError) as raised:
        await job.create()

    assert raised.value.response is not None
    status = raised.value.response.json()
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    assert status["message"] == (
        'jobs.batch is forbidden: User "system:serviceaccount:default:keraunos-controller" cannot create '
        'resource "jobs" in API group "batch" in the namespace "default"'
    )
    assert kube.controls.pending_faults() == []
    await job.create()  # the fault is used up
    await job.delete(propagation_policy="Background")


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
        client.delete(f"{JOBS}/{name}", params={"propagationPolicy": "Background"})

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
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    job = await Job(job_manifest(unique_name(), shell("exec sleep 60")), api=kr8s_api)
    await job.create()
    kube.controls.reset_requests()

    kube.controls.delete_underneath(job.name)

    assert kube.controls.count("delete", "jobs") == 0
    assert not await job.exists()


def test_a_bad_fault_is_refused_with_a_reason(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.post("/stand-in/faults", json={"verb": "explode", "resource": "jobs", "code": 500})

    assert response.status_code == 400 and "verb must be one of" in response.json()["error"]

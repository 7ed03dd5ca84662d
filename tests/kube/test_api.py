"""The stand-in's REST semantics, through kr8s and plain HTTP: discovery, create/get/list/patch/delete,
and errors as real `Status` objects with the API server's codes and reasons."""

from __future__ import annotations

from typing import Any

import httpx
import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Job, Pod
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def sleeping_job(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job that is never finished during a test (its process sleeps; the stand-in kills it at exit)."""
    return job_manifest(name, shell("exec sleep 60"), labels=labels)


async def test_kr8s_finds_jobs_and_pods_through_discovery(kr8s_api: kr8s.asyncio.Api) -> None:
    assert (await kr8s_api.version())["gitVersion"] == "v1.31.0"
    assert await kr8s_api.lookup_kind("jobs") == ("job.batch/v1", "jobs", True)
    assert await kr8s_api.lookup_kind("Pod") == ("pod/v1", "pods", True)
    assert await kr8s_api.lookup_kind("ns") == ("namespace/v1", "namespaces", False)
    assert [ns.name async for ns in kr8s_api.get("namespaces")] == ["default"]  # type: ignore[union-attr]


def test_requests_without_the_token_get_401_unauthorized(kube: KubeStandIn) -> None:
    response = httpx.get(f"{kube.base_url}{JOBS}")

    assert response.status_code == 401
    assert response.json()["kind"] == "Status" and response.json()["reason"] == "Unauthorized"
    assert httpx.get(f"{kube.base_url}/version").status_code == 200  # public, as in a real cluster


def test_a_path_the_server_does_not_serve_is_404_status(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.get("/apis/apps/v1/namespaces/default/deployments")

    assert response.status_code == 404
    assert response.json()["reason"] == "NotFound"


async def test_a_created_job_gets_server_metadata_and_the_api_servers_defaults(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    name = unique_name()
    job = await Job(sleeping_job(name), api=kr8s_api)
    await job.create()

    metadata, spec = job.metadata, job.spec
    assert metadata["namespace"] == "default" and len(metadata["uid"]) == 36
    assert metadata["creationTimestamp"].endswith("Z") and int(metadata["resourceVersion"]) > 0
    assert spec["completions"] == 1 and spec["parallelism"] == 1 and spec["backoffLimit"] == 0
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": metadata["uid"]}}
    template_labels = spec["template"]["metadata"]["labels"]
    assert template_labels["job-name"] == name and template_labels["controller-uid"] == metadata["uid"]
    assert spec["template"]["spec"]["containers"][0]["terminationMessagePolicy"] == "File"
    await job.delete(propagation_policy="Background")


async def test_creating_a_job_twice_is_409_already_exists(kr8s_api: kr8s.asyncio.Api) -> None:
    name = unique_name()
    await (await Job(sleeping_job(name), api=kr8s_api)).create()

    with pytest.raises(kr8s.ServerError) as raised:
        await (await Job(sleeping_job(name), api=kr8s_api)).create()

    assert raised.value.response is not None
    status = raised.value.response.json()
    assert status["code"] == 409 and status["reason"] == "AlreadyExists"
    assert status["message"] == f'jobs.batch "{name}" already exists'
    assert status["details"] == {"name": name, "group": "batch", "kind": "jobs"}
    await (await Job.get(name, api=kr8s_api)).delete(propagation_policy="Background")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: m["spec"]["template"]["spec"].update(containers=[]), "spec.template.spec.containers"),
        (lambda m: m["metadata"].update(name="Not_A_DNS_Name"), "metadata.name"),
        (lambda m: m["metadata"].update(name="x" * 64), "spec.template.labels"),
        (lambda m: m["metadata"].update(labels={"rollout": "has spaces"}), "metadata.labels"),
        (
            lambda m: m["spec"]["template"]["spec"].update(restartPolicy="Always"),
            "spec.template.spec.restartPolicy",
        ),
    ],
    ids=["no-containers", "bad-name", "name-over-63", "bad-label-value", "restart-always"],
)
def test_an_invalid_job_is_422_invalid_naming_the_field(kube: KubeStandIn, change: Any, field: str) -> None:
    manifest = sleeping_job(unique_name())
    change(manifest)
    with kube.client() as client:
        response = client.post(JOBS, json=manifest)

    assert response.status_code == 422
    status = response.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert field in [cause["field"] for cause in status["details"]["causes"]]
    assert status["message"].startswith('Job.batch "')


def test_a_non_string_env_value_is_400_bad_request_like_the_go_decoder(kube: KubeStandIn) -> None:
    manifest = sleeping_job(unique_name())
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "N", "value": 3}]
    with kube.client() as client:
        response = client.post(JOBS, json=manifest)

    assert response.status_code == 400
    assert "cannot unmarshal number" in response.json()["message"]


def test_creating_in_a_namespace_that_does_not_exist_is_404(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.post("/apis/batch/v1/namespaces/nowhere/jobs", json=sleeping_job(unique_name()))

    assert response.status_code == 404
    assert response.json()["message"] == 'namespaces "nowhere" not found'


async def test_generate_name_gets_five_random_characters(kr8s_api: kr8s.asyncio.Api) -> None:
    manifest = sleeping_job("unused")
    del manifest["metadata"]["name"]
    manifest["metadata"]["generateName"] = "kr-gen-"
    job = await Job(manifest, api=kr8s_api)
    await job.create()

    assert job.name.startswith("kr-gen-") and len(job.name) == len("kr-gen-") + 5
    await job.delete(propagation_policy="Background")


async def test_label_selectors_with_equality_and_set_terms_pick_the_right_jobs(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    run = unique_name("run")
    for name, role in (("a", "x"), ("b", "y"), ("c", "z")):
        await (await Job(sleeping_job(f"{run}-{name}", {"run": run, "role": role}), api=kr8s_api)).create()

    async def names(selector: str) -> list[str]:
        return [j.name async for j in kr8s_api.get("jobs", label_selector=selector)]  # type: ignore[union-attr]

    assert await names(f"run={run}") == [f"{run}-a", f"{run}-b", f"{run}-c"]
    assert await names(f"run={run},role!=y") == [f"{run}-a", f"{run}-c"]
    assert await names(f"run={run},role in (y,z)") == [f"{run}-b", f"{run}-c"]
    assert await names(f"run={run},role notin (x),!missing") == [f"{run}-b", f"{run}-c"]
    assert await names(f"run={run},missing") == []
    async for job in kr8s_api.get("jobs", label_selector=f"run={run}"):
        await job.delete(propagation_policy="Background")  # type: ignore[union-attr]


async def test_get_by_name_and_pages_of_a_list_work_as_kr8s_uses_them(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    run = unique_name("page")
    for index in range(3):
        await (await Job(sleeping_job(f"{run}-{index}", {"run": run}), api=kr8s_api)).create()

    job = await Job.get(f"{run}-1", api=kr8s_api)  # kr8s sends fieldSelector=metadata.name=...,
    assert job.name == f"{run}-1"
    with kube.client() as client:
        first = client.get(JOBS, params={"labelSelector": f"run={run}", "limit": 2}).json()
        rest = client.get(
            JOBS,
            params={"labelSelector": f"run={run}", "limit": 2, "continue": first["metadata"]["continue"]},
        ).json()
    assert [j["metadata"]["name"] for j in first["items"]] == [f"{run}-0", f"{run}-1"]
    assert first["metadata"]["remainingItemCount"] == 1
    assert [j["metadata"]["name"] for j in rest["items"]] == [f"{run}-2"] and "continue" not in rest[
        "metadata"
    ]
    assert first["kind"] == "JobList" and "kind" not in first["items"][0]  # as the API server sends lists
    async for item in kr8s_api.get("jobs", label_selector=f"run={run}"):
        await item.delete(propagation_policy="Background")  # type: ignore[union-attr]


async def test_patches_merge_labels_and_a_stale_resource_version_is_409_conflict(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    job = await Job(sleeping_job(unique_name()), api=kr8s_api)
    await job.create()
    first_version = job.metadata["resourceVersion"]

    await job.label(team="rl")  # merge patch
    await job.remove_label("team")  # JSON patch
    await job.patch({"metadata": {"annotations": {"note": "kept"}}})
    with kube.client() as client:
        stale = client.patch(
            f"{JOBS}/{job.name}",
            json={"metadata": {"resourceVersion": first_version, "labels": {"x": "y"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        immutable = client.patch(
            f"{JOBS}/{job.name}",
            json={"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "other:2"}]}}}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )

    assert "team" not in job.labels and job.annotations["note"] == "kept"
    assert int(job.metadata["resourceVersion"]) > int(first_version)
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert immutable.status_code == 422 and "field is immutable" in immutable.json()["message"]
    await job.delete(propagation_policy="Background")


async def test_deleting_what_is_not_there_is_404_not_found(kr8s_api: kr8s.asyncio.Api) -> None:
    with pytest.raises(kr8s.NotFoundError):
        await (await Pod({"metadata": {"name": "never-created"}}, api=kr8s_api)).delete()


async def test_a_pod_created_directly_runs_its_command(kr8s_api: kr8s.asyncio.Api) -> None:
    container = {"name": "main", "image": "busybox:1", "command": shell("echo direct")}
    pod = await Pod(
        {
            "metadata": {"name": unique_name("pod")},
            "spec": {"restartPolicy": "Never", "containers": [container]},
        },
        api=kr8s_api,
    )
    await pod.create()

    await pod.wait("jsonpath='{.status.phase}'=Succeeded", timeout=10)
    assert [line async for line in pod.logs()] == ["direct"]
    await pod.delete()


def test_jobs_in_a_new_namespace_are_listed_across_namespaces_and_deleted_by_collection(
    kube: KubeStandIn,
) -> None:
    namespace, run = unique_name("ns"), unique_name("run")
    with kube.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()
        for index, role in enumerate(("keep", "drop", "drop")):
            manifest = job_manifest(
                f"{run}-{index}", shell("exec sleep 60"), labels={"run": run, "role": role}
            )
            client.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", json=manifest).raise_for_status()

        everywhere = client.get("/apis/batch/v1/jobs", params={"labelSelector": f"run={run}"}).json()
        deleted = client.request(
            "DELETE",
            f"/apis/batch/v1/namespaces/{namespace}/jobs",
            params={"labelSelector": f"run={run},role=drop"},
            json={"propagationPolicy": "Background"},
        )
        left = client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs").json()
        client.delete(f"/api/v1/namespaces/{namespace}").raise_for_status()
        after_namespace = client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs").json()

    assert {j["metadata"]["namespace"] for j in everywhere["items"]} == {namespace}
    assert len(everywhere["items"]) == 3
    assert deleted.status_code == 200 and len(deleted.json()["items"]) == 2
    assert [j["metadata"]["name"] for j in left["items"]] == [f"{run}-0"]
    assert after_namespace["items"] == []


def test_subresources_take_only_their_verbs(kube: KubeStandIn) -> None:
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(name)).raise_for_status()
        status = client.get(f"{JOBS}/{name}/status")
        refused = client.delete(f"{JOBS}/{name}/status")
        client.delete(f"{JOBS}/{name}", params={"propagationPolicy": "Background"}).raise_for_status()

    assert status.status_code == 200 and status.json()["metadata"]["name"] == name
    assert refused.status_code == 405 and refused.json()["reason"] == "MethodNotAllowed"

"""The stand-in's REST semantics, through the runner's own client and plain HTTP: create, get, list,
delete of Jobs, the verbs it does not serve, and errors as real `Status` objects with the API
server's codes and reasons."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from kube_standin import KubeStandIn
from kube_support import job_manifest, shell, unique_name

from keraunos.controller.runners._k8s_api import KubeApi, KubeError

pytestmark = pytest.mark.anyio

JOBS = "/apis/batch/v1/namespaces/default/jobs"


def sleeping_job(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job that is never finished during a test (its process sleeps; the stand-in kills it at exit)."""
    return job_manifest(name, shell("exec sleep 60"), labels=labels)


def test_requests_without_the_token_get_401_unauthorized(kube: KubeStandIn) -> None:
    response = httpx.get(f"{kube.base_url}{JOBS}")

    assert response.status_code == 401
    assert response.json()["kind"] == "Status" and response.json()["reason"] == "Unauthorized"
    assert httpx.get(f"{kube.base_url}/version").json()["gitVersion"] == "v1.31.0"  # public, as in a cluster


@pytest.mark.parametrize(
    "path", ["/apis/apps/v1/namespaces/default/deployments", "/api", "/apis/batch/v1", "/api/v1/namespaces"]
)
def test_a_path_the_server_does_not_serve_is_404_status(kube: KubeStandIn, path: str) -> None:
    with kube.client() as client:
        response = client.get(path)

    assert response.status_code == 404
    assert response.json()["reason"] == "NotFound"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PATCH", f"{JOBS}/any"),
        ("PUT", f"{JOBS}/any"),
        ("DELETE", JOBS),
        ("POST", "/api/v1/namespaces/default/pods"),
        ("GET", "/api/v1/namespaces/default/pods/any"),
        ("DELETE", "/api/v1/namespaces/default/pods/any"),
    ],
)
def test_a_verb_the_runner_does_not_use_is_405_method_not_allowed(
    kube: KubeStandIn, method: str, path: str
) -> None:
    with kube.client() as client:
        response = client.request(method, path, json={})

    assert response.status_code == 405
    assert response.json()["reason"] == "MethodNotAllowed"


async def test_a_created_job_gets_server_metadata_and_the_api_servers_defaults(runner_api: KubeApi) -> None:
    name = unique_name()
    created = await runner_api.create_job(sleeping_job(name))

    metadata, spec = created["metadata"], created["spec"]
    assert metadata["namespace"] == "default" and len(metadata["uid"]) == 36
    assert metadata["creationTimestamp"].endswith("Z") and int(metadata["resourceVersion"]) > 1
    assert spec["completions"] == 1 and spec["parallelism"] == 1 and spec["backoffLimit"] == 0
    assert spec["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": metadata["uid"]}}
    template_labels = spec["template"]["metadata"]["labels"]
    assert template_labels["job-name"] == name and template_labels["controller-uid"] == metadata["uid"]
    assert spec["template"]["spec"]["containers"][0]["terminationMessagePolicy"] == "File"
    read = await runner_api.get_job(name)
    assert read is not None and read["metadata"]["uid"] == metadata["uid"]  # its status may be newer
    assert await runner_api.delete_job(name)


async def test_creating_a_job_twice_is_409_already_exists(runner_api: KubeApi) -> None:
    name = unique_name()
    await runner_api.create_job(sleeping_job(name))

    with pytest.raises(KubeError) as raised:
        await runner_api.create_job(sleeping_job(name))

    assert (raised.value.status, raised.value.reason) == (409, "AlreadyExists")
    assert raised.value.message == f'jobs.batch "{name}" already exists'
    await runner_api.delete_job(name)


async def test_a_job_that_is_not_there_reads_as_none_and_deletes_as_false(runner_api: KubeApi) -> None:
    assert await runner_api.get_job("never-created") is None
    assert await runner_api.delete_job("never-created") is False


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


async def test_a_label_selector_lists_the_matching_jobs_with_the_version_to_watch_from(
    runner_api: KubeApi,
) -> None:
    run = unique_name("run")
    for name, role in (("a", "x"), ("b", "y"), ("c", "x")):
        await runner_api.create_job(sleeping_job(f"{run}-{name}", {"run": run, "role": role}))

    async def names(selector: str) -> list[str]:
        return [job["metadata"]["name"] for job in (await runner_api.list_jobs(selector))[0]]

    assert await names(f"run={run}") == [f"{run}-a", f"{run}-b", f"{run}-c"]
    assert await names(f"run={run},role==x") == [f"{run}-a", f"{run}-c"]
    assert await names(f"run={run},role!=x") == [f"{run}-b"]
    jobs, version = await runner_api.list_jobs(f"run={run}")
    assert int(version) >= max(int(job["metadata"]["resourceVersion"]) for job in jobs)
    for name in ("a", "b", "c"):
        await runner_api.delete_job(f"{run}-{name}")


def test_a_set_based_label_selector_is_400_bad_request(kube: KubeStandIn) -> None:
    with kube.client() as client:
        response = client.get(JOBS, params={"labelSelector": "role in (x,y)"})

    assert response.status_code == 400 and response.json()["reason"] == "BadRequest"


def test_a_list_is_a_job_list_whose_items_carry_no_kind_like_the_api_servers(kube: KubeStandIn) -> None:
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(name)).raise_for_status()
        listed = client.get(JOBS, params={"labelSelector": f"test={name}"}).json()
        client.request("DELETE", f"{JOBS}/{name}", json={"propagationPolicy": "Background"})

    assert listed["kind"] == "JobList" and listed["apiVersion"] == "batch/v1"
    assert [item["metadata"]["name"] for item in listed["items"]] == [name]
    assert "kind" not in listed["items"][0]


def test_deleting_without_the_background_policy_is_422_and_the_job_stays(kube: KubeStandIn) -> None:
    name = unique_name()
    with kube.client() as client:
        client.post(JOBS, json=sleeping_job(name)).raise_for_status()
        orphaning = client.delete(f"{JOBS}/{name}")
        kept = client.get(f"{JOBS}/{name}")
        deleted = client.request("DELETE", f"{JOBS}/{name}", json={"propagationPolicy": "Background"})

    assert orphaning.status_code == 422 and "Background" in orphaning.json()["message"]
    assert kept.status_code == 200
    assert deleted.status_code == 200 and deleted.json()["status"] == "Success"

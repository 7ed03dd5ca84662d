"""`keraunos controller --runner k8s` end to end: a real controller process, a real gateway with the
engine stand-in behind it, and the Kubernetes stand-in whose node runs each Job's container (the test
agent) as a local process. One controller (instance `main`) runs every test's rollouts here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_support import (
    Controller,
    K8sEnv,
    create_rollouts,
    detail,
    jobs_of,
    rollout,
    start_controller,
    wait_for,
    wait_terminal,
)

from keraunos.controller.runners._k8s_names import job_name
from keraunos.testing.processes import unique_id

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def controller(k8s_session: K8sEnv) -> Iterator[Controller]:
    started = start_controller(
        k8s_session, "main", "--k8s-max-jobs-per-minute", "600", "--k8s-job-burst", "20"
    )
    yield started
    started.stop()


def job_state(env: K8sEnv, name: str) -> str | None:
    with env.kube.client() as api:
        response = api.get(f"/apis/batch/v1/namespaces/{env.kube.namespace}/jobs/{name}")
    if response.status_code == 404:
        return None
    for condition in response.json().get("status", {}).get("conditions") or []:
        if condition["status"] == "True" and condition["type"] in ("Complete", "Failed"):
            return condition["type"]
    return "running"


def test_rollouts_run_as_jobs_with_the_forced_fields_and_succeed_with_their_model_calls_recorded(
    k8s: K8sEnv, controller: Controller
) -> None:
    from kubernetes.client import ApiClient, V1Job

    ids = create_rollouts(k8s.gateway, [rollout("ok", question=f"q{i}") for i in range(3)])
    details = wait_terminal(k8s.gateway, ids, timeout=40)
    jobs = {j["metadata"]["name"]: j for j in jobs_of(k8s.kube, "main")}
    for rollout_id in ids:
        got = details[rollout_id]
        status = got["rollout"]["status"]
        assert status["state"] == "succeeded", got
        assert status["k8s_job_name"] == job_name(rollout_id, "1")
        (attempt,) = got["attempt_details"]
        assert (attempt["id"], attempt["outcome"], attempt["exit_code"]) == ("1", "succeeded", 0)
        with k8s.gateway.client() as api:
            events = api.get(f"/api/rollouts/{rollout_id}/events").json()
            logs = api.get(f"/api/rollouts/{rollout_id}/attempt/1/logs").text
        assert sorted((e["event_type"], e["attempt_id"]) for e in events) == [
            ("model_request", "1"),
            ("reward", "1"),
        ]
        assert "answer:" in logs and f"created Job {job_name(rollout_id, '1')}" in logs

        job: V1Job = ApiClient()._ApiClient__deserialize(jobs[job_name(rollout_id, "1")], "V1Job")  # type: ignore[attr-defined]
        assert job.metadata.labels["app.kubernetes.io/managed-by"] == "keraunos"
        assert job.metadata.labels["team"] == "tests"  # the template's own labels stay
        assert job.metadata.annotations["keraunos.dev/rollout-id"] == rollout_id
        assert (job.spec.backoff_limit, job.spec.ttl_seconds_after_finished) == (0, 600)
        assert job.spec.active_deadline_seconds == 60
        assert job.spec.template.spec.restart_policy == "Never"
        env = {e.name: e.value for e in job.spec.template.spec.containers[0].env}
        assert env["AGL_OPENAI_BASE_URL"] == k8s.gateway.proxy_base(rollout_id, "1")
        assert (
            env["AGL_KEY"] and env["AGL_KEY"] != k8s.gateway.key
        )  # the attempt's token, never the server key


def test_a_job_that_already_exists_for_the_attempt_is_adopted_not_duplicated(
    k8s: K8sEnv, controller: Controller
) -> None:
    rollout_id = unique_id("premade")
    name = job_name(rollout_id, "1")
    command = [sys.executable, "-c", "print('made before the claim')"]
    premade = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "keraunos", "keraunos.dev/instance": "main"},
            "annotations": {"keraunos.dev/rollout-id": rollout_id, "keraunos.dev/attempt-id": "1"},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "a", "image": "x", "command": command}],
                }
            },
        },
    }
    with k8s.kube.client() as api:  # as if a create had succeeded but its answer was lost
        assert (
            api.post(f"/apis/batch/v1/namespaces/{k8s.kube.namespace}/jobs", json=premade).status_code == 201
        )
    creates = k8s.kube.controls.count("create", "jobs")
    create_rollouts(k8s.gateway, [{**rollout("ok"), "rollout_id": rollout_id}])
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=30)[rollout_id]
    assert got["rollout"]["status"]["state"] == "succeeded"
    assert k8s.kube.controls.count("create", "jobs") == creates + 1  # one refused create, no second Job
    with k8s.gateway.client() as api:
        logs = api.get(f"/api/rollouts/{rollout_id}/attempt/1/logs").text
    assert "already existed for this attempt; adopted it" in logs and "made before the claim" in logs


def test_a_failing_job_fails_its_attempt_and_the_retry_runs_as_a_new_job(
    k8s: K8sEnv, controller: Controller
) -> None:
    (rollout_id,) = create_rollouts(
        k8s.gateway, [rollout("fail-first", max_attempts=2, retry_backoff_seconds=0)]
    )
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=40)[rollout_id]
    assert got["rollout"]["status"]["state"] == "succeeded"
    first, second = got["attempt_details"]
    assert (first["outcome"], first["exit_code"], second["outcome"]) == ("failed", 3, "succeeded")
    assert "the Job failed (BackoffLimitExceeded" in first["reason"]
    assert first["reason"].endswith("ValueError: the first attempt always gives up")
    assert job_state(k8s, job_name(rollout_id, "1")) == "Failed"
    assert job_state(k8s, job_name(rollout_id, "2")) == "Complete"


def test_a_template_that_does_not_make_one_job_fails_only_its_attempt(
    k8s: K8sEnv, controller: Controller
) -> None:
    config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
    bad, good = create_rollouts(k8s.gateway, [rollout("ok", template=config_map), rollout("ok")])
    got = wait_terminal(k8s.gateway, [bad, good], timeout=30)
    assert got[good]["rollout"]["status"]["state"] == "succeeded"
    assert got[bad]["rollout"]["status"]["state"] == "failed"
    (attempt,) = got[bad]["attempt_details"]
    assert attempt["outcome"] == "failed"
    assert attempt["reason"] == "job template: renders kind 'ConfigMap'; it must render a Job"
    assert job_state(k8s, job_name(bad, "1")) is None


def test_a_job_the_api_rejects_with_422_fails_its_attempt_with_the_apis_message(
    k8s: K8sEnv, controller: Controller
) -> None:
    k8s.kube.controls.fail_next(
        "create", "jobs", 422, message="spec.template.spec.containers[0].image: Required value"
    )
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("ok")])
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=30)[rollout_id]
    (attempt,) = got["attempt_details"]
    assert attempt["outcome"] == "failed"
    assert "422" in attempt["reason"] and "image: Required value" in attempt["reason"]


def test_a_create_answered_500_or_429_is_retried_and_the_job_made_once(
    k8s: K8sEnv, controller: Controller
) -> None:
    controls = k8s.kube.controls
    controls.fail_next("create", "jobs", 500)
    controls.fail_next("create", "jobs", 429)
    creates = controls.count("create", "jobs")
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("ok")])
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=30)[rollout_id]
    assert got["rollout"]["status"]["state"] == "succeeded"
    assert [a["outcome"] for a in got["attempt_details"]] == ["succeeded"]
    assert controls.count("create", "jobs") == creates + 3
    assert "cannot create Job; retrying" in controller.log()


def test_a_job_deleted_underneath_is_reported_lost(
    k8s: K8sEnv, controller: Controller, tmp_path: Path
) -> None:
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("wait", str(tmp_path / "never"))])
    name = job_name(rollout_id, "1")
    wait_for(lambda: job_state(k8s, name) == "running", 20, "the Job to run")
    k8s.kube.controls.delete_underneath(name)
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=20)[rollout_id]
    (attempt,) = got["attempt_details"]
    assert attempt["outcome"] == "lost"
    assert "deleted before it finished" in attempt["reason"]


def test_the_watch_resumes_after_a_drop_without_missing_the_end_of_a_job(
    k8s: K8sEnv, controller: Controller, tmp_path: Path
) -> None:
    controls = k8s.kube.controls
    release = tmp_path / "release"
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("wait", str(release))])
    name = job_name(rollout_id, "1")
    wait_for(lambda: job_state(k8s, name) == "running", 20, "the Job to run")
    controls.fail_next("watch", "jobs", 500, count=10_000)  # no watch can reopen until the test says
    controls.drop_watches(reset=True)
    release.touch()
    wait_for(lambda: job_state(k8s, name) == "Complete", 20, "the Job to complete")
    assert detail(k8s.gateway, rollout_id)["rollout"]["status"]["state"] == "running"  # nobody saw it yet
    controls.clear_faults()
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=15)[rollout_id]
    assert got["rollout"]["status"]["state"] == "succeeded"


def test_after_410_gone_the_runner_lists_again_and_catches_up_on_the_gap(
    k8s: K8sEnv, controller: Controller, tmp_path: Path
) -> None:
    controls = k8s.kube.controls
    release = tmp_path / "release"
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("wait", str(release))])
    name = job_name(rollout_id, "1")
    wait_for(lambda: job_state(k8s, name) == "running", 20, "the Job to run")
    lists_before = controls.count("list", "jobs")
    controls.fail_next("watch", "jobs", 500, count=10_000)
    controls.drop_watches(reset=True)
    release.touch()
    wait_for(lambda: job_state(k8s, name) == "Complete", 20, "the Job to complete")
    controls.forget_history()  # the runner's resourceVersion is now too old: 410
    controls.clear_faults()
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=15)[rollout_id]
    assert got["rollout"]["status"]["state"] == "succeeded"
    assert controls.count("list", "jobs") > lists_before
    assert "watch history expired (410)" in controller.log()

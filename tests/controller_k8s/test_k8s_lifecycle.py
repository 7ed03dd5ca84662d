"""The k8s runner's limits and its life: the creation rate limit and the cap on running Jobs, a
`kill -9` and restart that adopts the Jobs left running, and a 403 that stops the controller with the
missing permission. Each test starts its own controller (its own instance label)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from k8s_support import K8sEnv, create_rollouts, jobs_of, rollout, start_controller, wait_for, wait_terminal

from keraunos.controller.runners._k8s_names import job_name

pytestmark = pytest.mark.timeout(120)


def running_jobs(env: K8sEnv, instance: str) -> list[str]:
    def over(job: dict) -> bool:
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["status"] == "True" and c["type"] in ("Complete", "Failed") for c in conditions)

    return [j["metadata"]["name"] for j in jobs_of(env.kube, instance) if not over(j)]


def test_no_more_jobs_run_than_the_cap_and_creations_keep_to_the_rate_limit(
    k8s: K8sEnv, tmp_path: Path
) -> None:
    controller = start_controller(
        k8s,
        "limits",
        "--k8s-max-concurrent-jobs",
        "2",
        "--k8s-max-jobs-per-minute",
        "120",
        "--k8s-job-burst",
        "1",
    )
    release = tmp_path / "release"
    try:
        started = time.time()
        ids = create_rollouts(k8s.gateway, [rollout("wait", str(release)) for _ in range(4)])
        wait_for(lambda: len(running_jobs(k8s, "limits")) == 2, 20, "two Jobs to run")
        time.sleep(1.0)  # the rate limit would allow two more by now; the cap does not
        assert len(jobs_of(k8s.kube, "limits")) == 2
        release.touch()
        details = wait_terminal(k8s.gateway, ids, timeout=40)
        assert all(d["rollout"]["status"]["state"] == "succeeded" for d in details.values())
    finally:
        controller.stop()
    creates = sorted(
        r["time"]
        for r in k8s.kube.controls.request_log()
        if (r["verb"], r["resource"]) == ("create", "jobs") and r["time"] >= started
    )
    assert len(creates) == 4
    slack = 0.25  # the stand-in stamps each request when it answers it
    for i, first in enumerate(creates):
        for j in range(i + 1, len(creates)):
            # burst 1 at 2 per second: n creations need at least (n - 1) / 2 seconds
            assert creates[j] - first >= (j - i) / 2 - slack, creates


def test_a_restarted_controller_adopts_the_jobs_a_killed_one_left_and_finishes_their_attempts(
    k8s: K8sEnv, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    first = start_controller(k8s, "crash", "--lease-s", "30")
    ids = create_rollouts(k8s.gateway, [rollout("wait", str(release)) for _ in range(2)])
    wait_for(lambda: len(running_jobs(k8s, "crash")) == 2, 20, "both Jobs to run")
    first.kill()
    creates_before = k8s.kube.controls.count("create", "jobs")
    second = start_controller(k8s, "crash", "--lease-s", "30")
    try:
        release.touch()
        details = wait_terminal(k8s.gateway, ids, timeout=40)
    finally:
        second.stop()
    for rollout_id in ids:
        got = details[rollout_id]
        assert got["rollout"]["status"]["state"] == "succeeded", got
        (attempt,) = got["attempt_details"]  # the same attempt, finished by the second controller
        assert (attempt["id"], attempt["outcome"]) == ("1", "succeeded")
        with k8s.gateway.client() as api:
            logs = api.get(f"/api/rollouts/{rollout_id}/attempt/1/logs").text
        assert f"adopted Job {job_name(rollout_id, '1')}" in logs and "answer:" in logs
    assert k8s.kube.controls.count("create", "jobs") == creates_before  # nothing was created again


def test_a_403_stops_the_controller_with_a_message_naming_the_missing_permission(k8s: K8sEnv) -> None:
    controller = start_controller(k8s, "rbac")
    k8s.kube.controls.fail_next(
        "create",
        "jobs",
        403,
        count=4,
        message='jobs.batch is forbidden: User "agent-controller" cannot create',
    )
    create_rollouts(k8s.gateway, [rollout("ok")])
    assert controller.wait_exit(30) == 1
    output = controller.log()
    assert "error: the Kubernetes API refused to create jobs in namespace 'default' (403 Forbidden" in output
    assert "needs the RBAC permission verb 'create' on resource 'jobs' (apiGroup 'batch')" in output


def test_a_403_when_listing_jobs_at_startup_stops_the_controller_before_it_takes_work(k8s: K8sEnv) -> None:
    k8s.kube.controls.fail_next("list", "jobs", 403, count=4, message="cannot list jobs")
    controller = start_controller(k8s, "rbac-list", ready=False)
    assert controller.wait_exit(30) == 1
    output = controller.log()
    assert "verb 'list' on resource 'jobs'" in output
    assert "controller started" not in output


def test_sigterm_deletes_the_running_jobs_and_reports_their_attempts_lost(
    k8s: K8sEnv, tmp_path: Path
) -> None:
    controller = start_controller(k8s, "shutdown")
    (rollout_id,) = create_rollouts(k8s.gateway, [rollout("wait", str(tmp_path / "never"))])
    wait_for(lambda: len(running_jobs(k8s, "shutdown")) == 1, 20, "the Job to run")
    assert controller.stop() == 0
    assert jobs_of(k8s.kube, "shutdown") == []
    got = wait_terminal(k8s.gateway, [rollout_id], timeout=10)[rollout_id]
    (attempt,) = got["attempt_details"]
    assert attempt["outcome"] == "lost"
    assert attempt["reason"] == "the controller shut down before the agent finished; its Job was deleted"

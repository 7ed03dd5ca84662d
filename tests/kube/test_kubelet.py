"""The stand-in's node, through kr8s: each Job's command runs as a local process with its environment,
its output is the Pod log, and Job and Pod statuses follow the process like a real cluster's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import anyio
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Job, Pod
from kube_standin import KubeStandIn
from kube_support import eventually, job_manifest, live_group_members, python, shell, unique_name

pytestmark = pytest.mark.anyio


async def finished(job: Job, seconds: int = 10) -> str:
    """Wait for Complete or Failed; the condition type that came."""
    await job.wait(["condition=Complete", "condition=Failed"], timeout=seconds)
    return next(c["type"] for c in job.status["conditions"] if c["type"] in ("Complete", "Failed"))


async def pods_of(api: kr8s.asyncio.Api, job: Job) -> list[Pod]:
    return [p async for p in api.get("pods", label_selector={"job-name": job.name})]  # type: ignore[misc]


async def no_pods(api: kr8s.asyncio.Api, job: Job) -> bool:
    return not await pods_of(api, job)


async def gone(job: Job) -> bool:
    return not await job.exists()


async def test_a_job_runs_its_command_with_its_env_and_completes_with_the_output_as_pod_log(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    name = unique_name()
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "PHRASE", "value": "$(GREETING) world"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "ROLLOUT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['test']"}}},
    ]
    code = "import os; print(os.environ['PHRASE'], os.environ['POD_NAME'], os.environ['ROLLOUT'])"
    job = await Job(job_manifest(name, python(code), env=env), api=kr8s_api)
    await job.create()

    assert await finished(job) == "Complete"
    assert job.status["succeeded"] == 1 and "failed" not in job.status
    assert job.status["completionTime"] >= job.status["startTime"]
    [pod] = await pods_of(kr8s_api, job)
    assert pod.name.startswith(f"{name}-")
    assert pod.status["phase"] == "Succeeded"
    terminated = pod.status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert pod.labels["job-name"] == name and pod.labels["controller-uid"] == job.metadata["uid"]
    assert pod.metadata["ownerReferences"][0]["uid"] == job.metadata["uid"]
    assert [line async for line in pod.logs()] == [f"hello world {pod.name} {name}"]


async def test_a_failing_command_with_backoff_limit_0_fails_the_job_after_one_pod(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    job = await Job(job_manifest(unique_name(), shell("echo boom >&2; exit 3")), api=kr8s_api)
    await job.create()

    assert await finished(job) == "Failed"
    failed = next(c for c in job.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == "Job has reached the specified backoff limit"
    assert job.status["failed"] == 1 and "active" not in job.status
    [pod] = await pods_of(kr8s_api, job)
    assert pod.status["phase"] == "Failed"
    assert pod.status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert [line async for line in pod.logs()] == ["boom"]


async def test_backoff_limit_1_replaces_a_failed_pod_once(kr8s_api: kr8s.asyncio.Api) -> None:
    job = await Job(job_manifest(unique_name(), shell("exit 1"), backoffLimit=1), api=kr8s_api)
    await job.create()

    assert await finished(job) == "Failed"
    assert job.status["failed"] == 2
    assert len(await pods_of(kr8s_api, job)) == 2


async def test_active_deadline_kills_the_process_group_and_fails_with_deadline_exceeded(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    # The shell's child `sleep` must die too: the whole process group is stopped.
    job = await Job(
        job_manifest(unique_name(), shell("sleep 30 & wait"), activeDeadlineSeconds=1), api=kr8s_api
    )
    started = time.monotonic()
    await job.create()
    pod = await running_pod_of(kr8s_api, job)
    [pid] = [p["pid"] for p in kube.controls.state()["processes"] if p["pod"] == pod.name]

    assert await finished(job) == "Failed"
    assert time.monotonic() - started < 5
    failed = next(c for c in job.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert failed["message"] == "Job was active longer than specified deadline"
    assert live_group_members(pid) == []


async def test_deleting_a_running_job_in_the_background_kills_its_process_and_removes_its_pods(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api, tmp_path: object
) -> None:
    job = await Job(job_manifest(unique_name(), shell("echo started; exec sleep 30")), api=kr8s_api)
    await job.create()

    async def running_pod() -> Pod | None:
        pods = await pods_of(kr8s_api, job)
        return pods[0] if pods and pods[0].status.get("phase") == "Running" else None

    pod = await eventually(running_pod, what="a running pod")
    pid = next(p["pid"] for p in kube.controls.state()["processes"] if p["pod"] == pod.name)

    await job.delete(propagation_policy="Background")

    assert not await job.exists()
    await eventually(lambda: no_pods(kr8s_api, job), what="no pods")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_deleting_a_job_without_a_propagation_policy_orphans_its_pods_like_the_api_server(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    job = await Job(job_manifest(unique_name(), shell("true")), api=kr8s_api)
    await job.create()
    await finished(job)

    await job.delete()

    [pod] = await pods_of(kr8s_api, job)
    assert "ownerReferences" not in pod.metadata
    await pod.delete()


async def test_ttl_seconds_after_finished_deletes_the_finished_job_and_its_pods(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    job = await Job(job_manifest(unique_name(), shell("true"), ttlSecondsAfterFinished=1), api=kr8s_api)
    await job.create()
    await finished(job)

    await eventually(lambda: gone(job), what="the job deleted")
    assert await pods_of(kr8s_api, job) == []


async def test_pod_log_honours_tail_lines_and_limit_bytes(kr8s_api: kr8s.asyncio.Api) -> None:
    job = await Job(
        job_manifest(unique_name(), shell("for i in 1 2 3 4 5; do echo line$i; done")), api=kr8s_api
    )
    await job.create()
    await finished(job)
    [pod] = await pods_of(kr8s_api, job)

    assert [line async for line in pod.logs(tail_lines=2)] == ["line4", "line5"]
    assert [line async for line in pod.logs(limit_bytes=8)] == ["line1", "li"]


async def test_a_container_without_a_command_waits_with_create_container_config_error(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    manifest = job_manifest(unique_name(), [], activeDeadlineSeconds=1)
    del manifest["spec"]["template"]["spec"]["containers"][0]["command"]
    job = await Job(manifest, api=kr8s_api)
    await job.create()

    async def pod_with_status() -> Pod | None:
        pods = await pods_of(kr8s_api, job)
        return pods[0] if pods and "containerStatuses" in pods[0].status else None

    pod = await eventually(pod_with_status, what="a pod status")
    waiting = pod.status["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "command" in waiting["message"]
    assert await finished(job) == "Failed"  # the deadline still ends it


async def test_a_command_that_does_not_exist_fails_the_pod_with_start_error(
    kr8s_api: kr8s.asyncio.Api,
) -> None:
    job = await Job(job_manifest(unique_name(), ["/nonexistent/agent"]), api=kr8s_api)
    await job.create()

    assert await finished(job) == "Failed"
    [pod] = await pods_of(kr8s_api, job)
    terminated = pod.status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "StartError" and terminated["exitCode"] == 128
    assert "/nonexistent/agent" in terminated["message"]


async def running_pod_of(api: kr8s.asyncio.Api, job: Job) -> Pod:
    async def running() -> Pod | None:
        pods = await pods_of(api, job)
        return pods[0] if pods and pods[0].status.get("phase") == "Running" else None

    return await eventually(running, what="a running pod")


async def test_a_pod_deleted_while_it_runs_is_stopped_and_fails_its_job(
    kube: KubeStandIn, kr8s_api: kr8s.asyncio.Api
) -> None:
    job = await Job(job_manifest(unique_name(), shell("exec sleep 30")), api=kr8s_api)
    await job.create()
    pod = await running_pod_of(kr8s_api, job)

    await pod.delete()

    assert await finished(job) == "Failed"
    assert job.status["failed"] == 1
    assert not [p for p in kube.controls.state()["processes"] if p["pod"] == pod.name]
    await job.delete(propagation_policy="Background")


async def test_a_foreground_delete_keeps_the_job_until_its_pods_are_gone(kr8s_api: kr8s.asyncio.Api) -> None:
    job = await Job(job_manifest(unique_name(), shell("exec sleep 30")), api=kr8s_api)
    await job.create()
    await running_pod_of(kr8s_api, job)

    await job.delete(propagation_policy="Foreground")

    await eventually(lambda: gone(job), what="the job deleted")
    assert await pods_of(kr8s_api, job) == []


async def test_following_a_pod_log_streams_output_until_the_process_exits(kr8s_api: kr8s.asyncio.Api) -> None:
    job = await Job(job_manifest(unique_name(), shell("echo one; sleep 0.3; echo two")), api=kr8s_api)
    await job.create()
    pod = await running_pod_of(kr8s_api, job)

    with anyio.fail_after(10):
        lines = [line async for line in pod.logs(follow=True)]

    assert lines == ["one", "two"]


def test_stopping_the_stand_in_kills_the_processes_of_running_pods(
    kube_factory: Callable[..., KubeStandIn],
) -> None:
    kube = kube_factory()
    with kube.client() as client:
        client.post(
            "/apis/batch/v1/namespaces/default/jobs",
            json=job_manifest(unique_name(), shell("sleep 30 & wait")),
        ).raise_for_status()
    deadline = time.monotonic() + 10
    while not (processes := kube.controls.state()["processes"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    [process] = processes

    assert kube.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown
    assert live_group_members(process["pid"]) == []  # the shell and its child `sleep`

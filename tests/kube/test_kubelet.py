"""The stand-in's node, through the runner's own client: each Job's command runs as a local process
with its environment, its output is the Pod log, and Job and Pod statuses follow the process like a
real cluster's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_standin import KubeStandIn
from kube_support import eventually, finished, job_manifest, live_group_members, python, shell, unique_name

from keraunos.controller.runners._k8s_api import KubeApi, KubeError

pytestmark = pytest.mark.anyio


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in job["status"]["conditions"] if c["type"] == kind)


async def running_pod(api: KubeApi, name: str) -> dict[str, Any]:
    """The Job's Pod once it runs."""

    async def running() -> dict[str, Any] | None:
        pods = await api.list_pods(name)
        return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

    return await eventually(running, what="a running pod")


def pid_of(kube: KubeStandIn, pod: dict[str, Any]) -> int:
    return next(p["pid"] for p in kube.controls.state()["processes"] if p["pod"] == pod["metadata"]["name"])


async def test_a_job_runs_its_command_with_its_env_and_completes_with_the_output_as_pod_log(
    runner_api: KubeApi,
) -> None:
    name = unique_name()
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "PHRASE", "value": "$(GREETING) world"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "ROLLOUT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['test']"}}},
    ]
    code = "import os; print(os.environ['PHRASE'], os.environ['POD_NAME'], os.environ['ROLLOUT'])"
    created = await runner_api.create_job(job_manifest(name, python(code), env=env))

    job = await finished(runner_api, name)

    assert condition(job, "Complete")["status"] == "True"
    assert job["status"]["succeeded"] == 1 and "failed" not in job["status"]
    assert job["status"]["completionTime"] >= job["status"]["startTime"]
    [pod] = await runner_api.list_pods(name)
    pod_name = pod["metadata"]["name"]
    assert pod_name.startswith(f"{name}-") and pod["status"]["phase"] == "Succeeded"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert pod["metadata"]["labels"]["controller-uid"] == created["metadata"]["uid"]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert await runner_api.pod_log(pod_name, tail_lines=100) == f"hello world {pod_name} {name}\n".encode()


async def test_a_failing_command_with_backoff_limit_0_fails_the_job_after_one_pod(
    runner_api: KubeApi,
) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("echo boom >&2; exit 3")))

    job = await finished(runner_api, name)

    failed = condition(job, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == "Job has reached the specified backoff limit"
    assert job["status"]["failed"] == 1 and "active" not in job["status"]
    [pod] = await runner_api.list_pods(name)
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert await runner_api.pod_log(pod["metadata"]["name"], tail_lines=10) == b"boom\n"


async def test_backoff_limit_1_replaces_a_failed_pod_once(runner_api: KubeApi) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("exit 1"), backoffLimit=1))

    job = await finished(runner_api, name)

    assert condition(job, "Failed")["status"] == "True" and job["status"]["failed"] == 2
    assert len(await runner_api.list_pods(name)) == 2


async def test_active_deadline_kills_the_process_group_and_fails_with_deadline_exceeded(
    kube: KubeStandIn, runner_api: KubeApi
) -> None:
    # The shell's child `sleep` must die too: the whole process group is stopped.
    name = unique_name()
    started = time.monotonic()
    await runner_api.create_job(job_manifest(name, shell("sleep 30 & wait"), activeDeadlineSeconds=1))
    pid = pid_of(kube, await running_pod(runner_api, name))

    job = await finished(runner_api, name)

    assert time.monotonic() - started < 5
    failed = condition(job, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert failed["message"] == "Job was active longer than specified deadline"
    assert live_group_members(pid) == []


async def test_deleting_a_running_job_in_the_background_kills_its_process_and_removes_its_pods(
    kube: KubeStandIn, runner_api: KubeApi
) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("echo started; exec sleep 30")))
    pid = pid_of(kube, await running_pod(runner_api, name))

    assert await runner_api.delete_job(name)

    assert await runner_api.get_job(name) is None

    async def no_pods() -> bool:
        return not await runner_api.list_pods(name)

    await eventually(no_pods, what="no pods")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_ttl_seconds_after_finished_deletes_the_finished_job_and_its_pods(runner_api: KubeApi) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("true"), ttlSecondsAfterFinished=1))
    await finished(runner_api, name)

    async def gone() -> bool:
        return await runner_api.get_job(name) is None

    await eventually(gone, what="the job deleted")
    assert await runner_api.list_pods(name) == []


async def test_pod_log_honours_tail_lines(runner_api: KubeApi) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, shell("for i in 1 2 3 4 5; do echo line$i; done")))
    await finished(runner_api, name)
    [pod] = await runner_api.list_pods(name)

    assert await runner_api.pod_log(pod["metadata"]["name"], tail_lines=2) == b"line4\nline5\n"
    assert await runner_api.pod_log(pod["metadata"]["name"], tail_lines=0) == b""


async def test_a_container_without_a_command_waits_with_create_container_config_error(
    runner_api: KubeApi,
) -> None:
    name = unique_name()
    manifest = job_manifest(name, [], activeDeadlineSeconds=1)
    del manifest["spec"]["template"]["spec"]["containers"][0]["command"]
    await runner_api.create_job(manifest)

    async def pod_with_status() -> dict[str, Any] | None:
        pods = await runner_api.list_pods(name)
        return pods[0] if pods and "containerStatuses" in pods[0]["status"] else None

    pod = await eventually(pod_with_status, what="a pod status")
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError" and "command" in waiting["message"]
    with pytest.raises(KubeError) as raised:
        await runner_api.pod_log(pod["metadata"]["name"], tail_lines=10)
    assert (
        raised.value.status == 400 and "waiting to start: CreateContainerConfigError" in raised.value.message
    )
    assert condition(await finished(runner_api, name), "Failed")["status"] == "True"  # the deadline ends it


async def test_a_command_that_does_not_exist_fails_the_pod_with_start_error(runner_api: KubeApi) -> None:
    name = unique_name()
    await runner_api.create_job(job_manifest(name, ["/nonexistent/agent"]))

    await finished(runner_api, name)

    [pod] = await runner_api.list_pods(name)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "StartError" and terminated["exitCode"] == 128
    assert "/nonexistent/agent" in terminated["message"]


async def test_only_the_first_container_runs_and_a_log_without_a_container_name_is_400(
    runner_api: KubeApi,
) -> None:
    name = unique_name()
    manifest = job_manifest(name, shell("echo first"))
    containers = manifest["spec"]["template"]["spec"]["containers"]
    containers.append({"name": "sidecar", "image": "example.org/sidecar:1", "command": shell("exit 9")})
    await runner_api.create_job(manifest)

    job = await finished(runner_api, name)

    assert condition(job, "Complete")["status"] == "True"
    [pod] = await runner_api.list_pods(name)
    with pytest.raises(KubeError) as raised:
        await runner_api.pod_log(pod["metadata"]["name"], tail_lines=10)
    assert raised.value.status == 400 and "choose one of: [agent sidecar]" in raised.value.message


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

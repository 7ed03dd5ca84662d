"""Helpers of the Kubernetes runner tests: a `keraunos controller --runner k8s` process, rollouts, waits.

Fixtures wrapping these live in this directory's conftest.py; test modules import from here (a module
name no other test directory uses), never from `conftest`. The Jobs' containers run `python -m
k8s_agent` (agents/k8s_agent.py) as local processes of the Kubernetes stand-in. Every time constant
is short: polls of 0.1 s, retries from 0.05 s.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_standin import KubeStandIn

from keraunos.testing.processes import (
    SERVED_MODEL,
    Gateway,
    RunningProcess,
    clean_env,
    keraunos_command,
    wait_for,
)

AGENTS_DIR = Path(__file__).resolve().parent / "agents"

#: Gateway flags: the engine stand-in's model, short proxy retries.
GATEWAY_ARGS = (
    "--served-model",
    SERVED_MODEL,
    "--proxy-max-attempts",
    "2",
    "--proxy-backoff-initial-s",
    "0.01",
)

#: The stand-in's fast clocks.
KUBE_ARGS = ("--retry-backoff-seconds", "0.05", "--max-grace-seconds", "0.5")

#: One Job running the test agent; `input.args` are its arguments, `input.question` its QUESTION.
TEMPLATE = f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {{{{ job_name }}}}
  labels:
    team: tests
spec:
  template:
    spec:
      containers:
        - name: agent
          image: example.org/keraunos-test-agent:1
          command: ["{sys.executable}", "-m", "k8s_agent"]
          args: [{{{{ input.args | map('yaml_escape') | join(', ') }}}}]
          env:
            - name: QUESTION
              value: {{{{ input.question | yaml_escape }}}}
"""


@dataclass
class K8sEnv:
    """A gateway (engine stand-in behind it) and a Kubernetes stand-in, shared by the tests."""

    gateway: Gateway
    kube: KubeStandIn
    workdir: Path
    template_file: Path


@dataclass
class Controller(RunningProcess):
    """A running `keraunos controller --runner k8s`."""

    log_dir: Path
    instance: str


def start_controller(
    env: K8sEnv, name: str, *args: str, instance: str | None = None, ready: bool = True
) -> Controller:
    """Start a k8s-runner controller with instance label `instance` (default: `name`)."""
    workdir = env.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    instance = instance or name
    log_path = workdir / "controller.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # a restart appends to the same log
    cmd = keraunos_command(
        "controller",
        "--runner",
        "k8s",
        "--gateway",
        env.gateway.base_url,
        "--key",
        env.gateway.key,
        "--state-dir",
        str(workdir / "state"),
        "--log-dir",
        str(workdir / "logs"),
        "--poll-interval-s",
        "0.1",
        "--lease-s",
        "10",
        "--k8s-kubeconfig",
        str(env.kube.kubeconfig_path),
        "--k8s-instance",
        instance,
        "--k8s-job-template-file",
        str(env.template_file),
        "--k8s-ttl-s",
        "600",
        "--k8s-retry-initial-s",
        "0.05",
        "--k8s-retry-max-s",
        "0.3",
        "--k8s-deadline-grace-s",
        "5",
        *args,
    )
    with log_path.open("ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=workdir)
    controller = Controller(process, log_path, workdir / "logs", instance)
    if ready:
        deadline = time.monotonic() + 30
        while "controller started" not in controller.log()[offset:]:
            if process.poll() is not None or time.monotonic() > deadline:
                controller.kill()
                raise RuntimeError(f"keraunos controller did not start:\n{controller.log()}")
            time.sleep(0.05)
    return controller


def rollout(*args: str, question: str = "2+2?", template: str | None = None, **config: Any) -> dict[str, Any]:
    """A rollout item whose Job runs `k8s_agent ARGS` (with the controller's default template unless given)."""
    if template is not None:
        config["k8s"] = {"job_template": template}
    return {"input": {"question": question, "args": list(args)}, "config": {"timeout_seconds": 60, **config}}


def create_rollouts(gateway: Gateway, items: Sequence[dict[str, Any]]) -> list[str]:
    """`POST /api/rollouts`; the ids, in order."""
    with gateway.client() as api:
        response = api.post("/api/rollouts", json=list(items))
    assert response.status_code == 201, response.text
    return [item["rollout_id"] for item in response.json()]


def detail(gateway: Gateway, rollout_id: str) -> dict[str, Any]:
    """`GET /api/rollouts/{id}`: `{rollout, attempts, attempt_details}`."""
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_terminal(gateway: Gateway, rollout_ids: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Wait until every rollout is succeeded or failed; their details by id."""

    def done() -> bool:
        return all(
            detail(gateway, r)["rollout"]["status"]["state"] in ("succeeded", "failed") for r in rollout_ids
        )

    wait_for(done, timeout, f"rollouts {list(rollout_ids)[:4]} to end", interval=0.1)
    return {r: detail(gateway, r) for r in rollout_ids}


def jobs_of(kube: KubeStandIn, instance: str) -> list[dict[str, Any]]:
    """The Jobs a controller instance made, as the API serves them."""
    selector = f"app.kubernetes.io/managed-by=keraunos,keraunos.dev/instance={instance}"
    with kube.client() as api:
        response = api.get(
            f"/apis/batch/v1/namespaces/{kube.namespace}/jobs", params={"labelSelector": selector}
        )
    response.raise_for_status()
    return response.json()["items"]


def end_leftovers(gateway: Gateway) -> None:
    """Fail every rollout a test left queuing or running, so the next test's controller never sees it."""
    with gateway.client() as api:
        left = api.get("/api/rollouts", params={"state_in": ["queuing", "running"], "limit": 100000}).json()
        for item in left:
            api.patch(f"/api/rollouts/{item['rollout_id']}", json={"status": {"state": "failed"}})

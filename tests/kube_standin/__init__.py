"""A Kubernetes API server stand-in for tests, where no real kube-apiserver can run.

A test double, not part of keraunos: it lives under tests/ (importable as `kube_standin` because
pytest puts tests/ on `sys.path`) and is not in the wheel.

`start_kube(workdir)` starts `python -m kube_standin` on a free loopback port and returns a
`KubeStandIn`: its `base_url`, the `kubeconfig_path` a client (kr8s, the runner) loads, and
`controls` to steer it (inject failures, count requests, drop watches, forget the watch history,
delete a Job underneath a client). It serves what keraunos's Kubernetes runner calls
(keraunos/controller/runners/_k8s_api.py) with the real server's resourceVersions, watches,
`Status` errors and Pod logs, and a node that runs each Job's first container `command` + `args`
as a local process (the image is ignored). See docs/kube-stand-in.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from keraunos._subprocess import stop_process
from keraunos.testing.processes import clean_env

__all__ = ["KubeControls", "KubeStandIn", "start_kube"]

#: The directory that holds this package (tests/): the stand-in's process needs it on PYTHONPATH.
TESTS_DIR = Path(__file__).resolve().parent.parent


class KubeControls:
    """The stand-in's test controls (`/stand-in/...`), from Python.

    Its requests (and `KubeStandIn.client()`'s) skip TLS set-up: the stand-in serves plain HTTP on
    loopback, and loading the CA bundle would cost a tenth of a second per client.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = httpx.request(
            method, f"{self.base_url}/stand-in/{path}", json=body, timeout=10, verify=False
        )
        response.raise_for_status()
        return response.json()

    def fail_next(
        self,
        verb: str,
        resource: str,
        code: int,
        *,
        count: int = 1,
        message: str = "",
        retry_after_seconds: int = 1,
    ) -> None:
        """Answer the next `count` requests of `verb` (`create`, `get`, `list`, `watch`, `delete`, `*`) on `resource`
        (`jobs`, `pods`, `pods/log`, `*`) with `code` and a real-looking `Status` (RBAC wording for 403).

        kr8s retries a 401/403 three times before raising, so a 403 it should see needs `count=4`.
        """
        self._call(
            "POST",
            "faults",
            {
                "verb": verb,
                "resource": resource,
                "code": code,
                "count": count,
                "message": message,
                "retry_after_seconds": retry_after_seconds,
            },
        )

    def pending_faults(self) -> list[dict[str, Any]]:
        """Injected faults not used up yet."""
        return self._call("GET", "faults")["pending"]

    def clear_faults(self) -> None:
        """Forget every pending fault."""
        self._call("DELETE", "faults")

    def requests(self) -> dict[str, int]:
        """Requests served so far by `"verb resource"`, e.g. `{"create jobs": 3, "watch jobs": 1}`."""
        return self._call("GET", "requests")["counts"]

    def request_log(self) -> list[dict[str, Any]]:
        """The latest requests, oldest first: `{time, verb, resource, namespace, name, code}`."""
        return self._call("GET", "requests")["recent"]

    def count(self, verb: str, resource: str) -> int:
        """How many `verb` requests on `resource` were served so far."""
        return self.requests().get(f"{verb} {resource}", 0)

    def reset_requests(self) -> None:
        """Start counting requests from zero."""
        self._call("DELETE", "requests")

    def drop_watches(self, *, reset: bool = False) -> int:
        """End every open watch: cleanly (the stream ends) or, with `reset`, by breaking the connection
        mid-stream. Returns how many were open."""
        return self._call("POST", "watches/drop", {"reset": reset})["dropped"]

    def forget_history(self) -> int:
        """Drop the watch history: a watch from any older resourceVersion now gets 410 Expired."""
        return self._call("POST", "history/forget")["compacted"]

    def delete_underneath(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """Delete a Job as someone else would (Background; not counted, never faulted): its Pods go too."""
        body: dict[str, Any] = {"name": name}
        if namespace is not None:
            body["namespace"] = namespace
        return self._call("POST", "delete", body)

    def state(self) -> dict[str, Any]:
        """`{resourceVersion, compacted, openWatches, processes: [{namespace, pod, pid}]}`."""
        return self._call("GET", "state")


@dataclass
class KubeStandIn:
    """A running stand-in: where it listens, its kubeconfig, and its controls."""

    base_url: str
    kubeconfig_path: Path
    namespace: str
    token: str
    process: subprocess.Popen[bytes]
    log_path: Path
    controls: KubeControls

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header clients send."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self) -> httpx.Client:
        """An httpx client of the API (authenticated)."""
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=30, verify=False)

    def log(self) -> str:
        """What the stand-in wrote to stderr/stdout."""
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM (Pod processes are killed, watches end), SIGKILL after `grace`; the exit status."""
        return stop_process(self.process, grace)


def start_kube(
    workdir: Path,
    *,
    namespace: str = "default",
    token: str = "stand-in-token",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout: float = 30.0,
) -> KubeStandIn:
    """Start the stand-in (a subprocess on a free 127.0.0.1 port) and wait until it answers.

    `args` are more `python -m kube_standin` flags (e.g. `--retry-backoff-seconds 0.1`).
    Pod logs and working directories go under `workdir/kube`; the kubeconfig is `workdir/kubeconfig`.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    log_path = workdir / "kube-stand-in.log"
    cmd = [
        sys.executable,
        "-m",
        "kube_standin",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        namespace,
        "--token",
        token,
        "--workdir",
        str(workdir / "kube"),
        *args,
    ]
    environment = clean_env(env)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS_DIR), environment.get("PYTHONPATH", "")) if p
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=workdir)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and process.poll() is None:
        if kubeconfig.exists():
            server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
            try:
                if httpx.get(f"{server}/readyz", timeout=1, verify=False).status_code == 200:
                    return KubeStandIn(
                        server, kubeconfig, namespace, token, process, log_path, KubeControls(server)
                    )
            except httpx.TransportError:
                pass
        time.sleep(0.02)
    stop_process(process, 5)
    raise RuntimeError(f"kubernetes stand-in did not become ready:\n{log_path.read_text(errors='replace')}")

"""Helpers of the verl tests: the verl venv, running `verl_side.py` in it, and scripted agents.

A module of its own (not conftest.py) so test modules import it by a name no other test directory
uses. verl 0.9 runs from `.venv-verl` (`$KERAUNOS_TEST_VERL_VENV`), which `.ci/run` creates: its pins
(transformers <5.11, tensordict <=0.10, ray) cannot share keraunos's venv. Without it the tests skip
and say why; with `CI=true` they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
from prerequisites import REPO, agl_binary, missing

from keraunos.testing.processes import clean_env

VERL_VERSION = "0.9.1"
HERE = Path(__file__).resolve().parent
INSTALL = (
    "python3 -m venv .venv-verl && .venv-verl/bin/pip install -c constraints.txt torch==2.13.0 && "
    ".venv-verl/bin/pip install -c constraints.txt -e '.[verl]'"
)


def verl_venv() -> Path:
    """The venv holding verl (`$KERAUNOS_TEST_VERL_VENV`, default `.venv-verl`)."""
    return Path(os.environ.get("KERAUNOS_TEST_VERL_VENV", REPO / ".venv-verl"))


def require_verl() -> Path:
    """The verl venv's python; `missing` (skip, or fail in CI) when verl or keraunos is not there."""
    python = verl_venv() / "bin" / "python"
    if not python.exists():
        missing(f"verl is not installed in {verl_venv()} (install it with: {INSTALL})")
    probe = (
        "import importlib.metadata as m, importlib.util as u, sys; "
        f"sys.exit(not (m.version('verl') == '{VERL_VERSION}' and u.find_spec('keraunos')))"
    )
    if subprocess.run([str(python), "-c", probe], check=False, timeout=60).returncode != 0:
        missing(f"{verl_venv()} has no verl {VERL_VERSION} with keraunos (install it with: {INSTALL})")
    return python


def run_in_verl(script: str, spec: dict[str, Any] | None = None, timeout: float = 300) -> dict[str, Any]:
    """Run `tests/verl/<script>` with the verl venv's python, `spec` as JSON on stdin; its JSON out."""
    return run_side(require_verl(), script, spec, timeout)


def require_agl_verl_client() -> Path:
    """The Agent Lightning 1.0.2 venv's python, able to import its verl-side rollout manager (which
    needs numpy, not in Agent Lightning's own requirements); `missing` otherwise."""
    python = agl_binary("agl-controller").with_name("python")
    probe = "import agentlightning.verl.agl_rollout_manager"
    if (
        subprocess.run([str(python), "-c", probe], check=False, timeout=60, capture_output=True).returncode
        != 0
    ):
        missing(
            f"{python} cannot import agentlightning.verl.agl_rollout_manager "
            f"(install numpy there: {python.parent}/pip install numpy)"
        )
    return python


def run_side(python: Path, script: str, spec: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    """Run `tests/verl/<script>` with `python`, `spec` as JSON on stdin; the JSON it prints last."""
    result = subprocess.run(
        [str(python), str(HERE / script)],
        input=json.dumps(spec or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env({"PYTHONPATH": str(HERE), "RAY_DEDUP_LOGS": "0"}),
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


Play = Callable[[str], dict[str, Any]]


async def play(api: httpx.AsyncClient, rollout_id: str, plan: dict[str, Any]) -> None:
    """An agent and its controller for one rollout: `turns` chat calls through the proxy, each
    prompt the history + reply + a tool message; with `rewrite`, the third call's history drops the
    first reply and tool message (a merge break); then the reward and `succeeded`."""
    await api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "running"}})
    url = f"/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {rollout_id} w1 w2 w3"}]
    for turn in range(plan.get("turns", 3)):
        if plan.get("rewrite") and turn == 2:
            messages = [messages[0], *messages[3:]]
        answer = (await api.post(url, json={"messages": messages, "max_tokens": 6})).json()
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        messages.append({"role": "tool", "content": f"result {turn} w4 w5"})
    event = {"event_type": "reward", "data": {"value": plan["reward"]}}
    await api.post(f"/api/rollouts/{rollout_id}/attempt/0/events", json=event)
    await api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"state": "succeeded"}})


@contextlib.asynccontextmanager
async def agents(base_url: str, key: str, prefix: str, plan: Play) -> AsyncIterator[None]:
    """Play every queuing rollout whose id starts with `prefix` by `plan(rollout_id)`, in the background."""
    started: set[str] = set()
    tasks: list[asyncio.Task[None]] = []

    async def watch(api: httpx.AsyncClient) -> None:
        while True:
            queuing = (await api.get("/api/rollouts", params={"state_in": "queuing", "limit": 10_000})).json()
            for rollout in queuing:
                rid = rollout["rollout_id"]
                if rid.startswith(prefix) and rid not in started:
                    started.add(rid)
                    tasks.append(asyncio.create_task(play(api, rid, plan(rid))))
            await asyncio.sleep(0.02)

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as api:
        watcher = asyncio.create_task(watch(api))
        try:
            yield
        finally:
            for task in [watcher, *tasks]:
                task.cancel()
            await asyncio.gather(watcher, *tasks, return_exceptions=True)

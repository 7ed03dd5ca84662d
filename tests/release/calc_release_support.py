"""What the opt-in end-to-end releases of the calc agent share: processes, the CLI, the traffic.

Every part runs as its own process on 127.0.0.1, as a user starts it (`keraunos gateway`,
`keraunos serve`, `keraunos controller`, `keraunos release run`); the test plays the traffic, creating
rollouts that ask for a resource's `production` label until the release is final. A module of its
own (not conftest.py) so the test modules import it by a name no other test directory uses.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos.testing.processes import (
    Gateway,
    RunningProcess,
    clean_env,
    free_port,
    keraunos_command,
    start_gateway,
    wait_for,
)

#: The served model's name: the gateway sends it whatever the agent asked for.
SERVED = "calc/demo-tiny"
#: The plan of the releases: two canary stages, handed over after 30 finished rollouts.
STAGES = "0.2,0.5"
MIN_STAGE_ROLLOUTS = "30"
#: Hard bounds per release: rollouts created and seconds waited before the test fails.
ROLLOUT_CAP = 800  # simulated at rewards 0.1 against 0.4, 1 % of releases need more than 500
RELEASE_DEADLINE_S = 420.0
#: Rollouts the test keeps in flight (the controller's pool runs them at once).
IN_FLIGHT = 8
NOT_TERMINAL = ("queuing", "running")


@dataclass
class Stack:
    gateway: Gateway
    serves: list[RunningProcess]
    controller: RunningProcess
    runner: RunningProcess
    base: Path
    endpoints: list[str] = field(default_factory=list)

    def logs(self) -> str:
        processes = [*self.serves, self.controller, self.runner]
        parts = [f"--- {p.log_path.name}\n{p.log()[-3000:]}" for p in processes]
        return "\n".join([*parts, f"--- gateway\n{self.gateway.log()[-3000:]}"])


def skip_unless_opted_in(request: pytest.FixtureRequest, path: str) -> None:
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"opt-in: pytest -m slow {path}")


def start(base: Path, name: str, args: Sequence[str]) -> RunningProcess:
    """`keraunos ARGS` in the background, its output in `base/NAME.log`."""
    log_path = base / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            keraunos_command(*args), stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=base
        )
    return RunningProcess(process, log_path)


def healthy(url: str) -> bool:
    """Whether `url` answers 200 now (False while nothing listens there yet)."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def cache_dir() -> Path:
    """The cache of the demo's prepared model: `$KERAUNOS_CACHE_DIR`, else `~/.cache/keraunos`."""
    from keraunos.demo.prepare import cache_root

    return cache_root("", os.environ)


def prepared_model() -> Path:
    """The demo's default warm-started model, from the cache (built there the first time)."""
    from keraunos.demo.prepare import prepare_model
    from keraunos.demo.recipe import Recipe

    return prepare_model(Recipe(), cache_dir()).path


@contextmanager
def running_stack(base: Path, models: Sequence[tuple[Path, int]]) -> Iterator[Stack]:
    """A gateway (SQLite), one `keraunos serve` per (model directory, weights version) registered
    at that version, a controller running `CalcAgent`, and a release runner; all stopped after."""
    started: list[Any] = []
    try:
        serves: list[RunningProcess] = []
        ports: list[int] = []
        for index, (model, _) in enumerate(models):
            port = free_port()
            serve = start(
                base,
                f"serve-{index}",
                (
                    "serve", "--model", str(model), "--served-model-name", SERVED,
                    "--host", "127.0.0.1", "--port", str(port),
                ),
            )  # fmt: skip
            started.append(serve)
            serves.append(serve)
            ports.append(port)
        gateway = start_gateway(base / "gateway", args=("--served-model", SERVED))
        started.append(gateway)
        endpoints = [f"http://127.0.0.1:{port}/v1" for port in ports]
        for serve, port in zip(serves, ports, strict=True):
            wait_for(
                lambda s=serve, p=port: s.process.poll() is None and healthy(f"http://127.0.0.1:{p}/health"),
                120,
                "serve",
            )
        with gateway.client() as api:
            registered = [
                {"model": SERVED, "endpoint": endpoint, "version": version}
                for endpoint, (_, version) in zip(endpoints, models, strict=True)
            ]
            assert api.post("/api/models", json=registered).status_code == 201
        connect = ("--gateway", gateway.base_url, "--key", gateway.key)
        controller = start(
            base,
            "controller",
            (
                "controller", *connect,
                "--agent-class", "keraunos.examples.calc.agent:CalcAgent",
                "--warm-workers", "2",
                "--pool-size", str(IN_FLIGHT),
                "--poll-interval-s", "0.1",
                "--state-dir", str(base / "state"),
                "--log-dir", str(base / "agents"),
            ),
        )  # fmt: skip
        started.append(controller)
        runner = start(
            base, "runner", ("release", "run", *connect, "--runner-id", "e2e", "--poll-interval-s", "0.3")
        )
        started.append(runner)
        yield Stack(gateway, serves, controller, runner, base, endpoints)
    finally:
        for process in reversed(started):
            process.stop()


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`keraunos ARGS` against the stack's gateway, to the end."""
    env = clean_env(
        {"KERAUNOS_GATEWAY_URL": stack.gateway.base_url, "KERAUNOS_GATEWAY_KEY": stack.gateway.key}
    )
    return subprocess.run(
        keraunos_command(*args),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=stack.base,
        check=False,
    )


def production(api: httpx.Client, resource: str) -> int:
    """The version the `production` label of `resource` points at now."""
    answer = api.get(f"/api/resources/{resource}/versions/production")
    assert answer.status_code == 200, answer.text
    return answer.json()["version"]


QUESTIONS = itertools.count()


def items_asking_for(resource: str) -> Callable[[int], list[dict[str, Any]]]:
    """`count` rollouts asking for `resource`'s production version, questions of the demo's kind
    (single digits) from a seed stream of their own (rollout ids unique across the test run)."""
    from keraunos.demo.recipe import questions

    def items(count: int) -> list[dict[str, Any]]:
        made = []
        for _ in range(count):
            number = next(QUESTIONS)
            row = questions(90_000 + number, 1, 9)[0]
            made.append(
                {
                    "rollout_id": f"calc-{number}",
                    "input": {"question": row["question"], "answer": row["answer"]},
                    "config": {"local": {"env_map": {"AGENT_INPUT": "input"}}},
                    "resources": {resource: "production"},
                }
            )
        return made

    return items


@dataclass
class Outcome:
    release: dict[str, Any]
    created: int
    seconds: float
    observations: list[dict[str, Any]]


def release_and_drive(stack: Stack, resource: str, release_id: str, candidate: int) -> Outcome:
    """Start a release of `candidate` on `resource`'s `production` with the CLI, then create
    rollouts (at most `IN_FLIGHT` unfinished at a time) until the runner has made it final.

    The release and rollout ids are fixed, so the canary's split (a hash of both) is the same run
    after run: the sample-ratio check, which may raise a false alarm on a healthy split (about 4
    releases in 1,000 of this plan, simulated), cannot make the test flaky; the rewards still come
    from the model's sampling."""
    started = cli(
        stack,
        "release", "start", resource,
        "--candidate", str(candidate),
        "--release-id", release_id,
        "--stages", STAGES,
        "--min-stage-rollouts", MIN_STAGE_ROLLOUTS,
        "--json",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["release_id"] == release_id
    next_items = items_asking_for(resource)
    began = time.monotonic()
    created = 0
    with stack.gateway.client() as api:
        while True:
            release = api.get(f"/api/releases/{release_id}").json()
            if release["state"] in ("promoted", "rolled_back", "aborted"):
                break
            elapsed = time.monotonic() - began
            if created >= ROLLOUT_CAP or elapsed > RELEASE_DEADLINE_S:
                pytest.fail(
                    f"release {release_id} still {release['state']} (stage {release['stage']}) after "
                    f"{created} rollouts and {elapsed:.0f}s: {release['reason']}\n{stack.logs()}"
                )
            query: list[tuple[str, Any]] = [("state_in", state) for state in NOT_TERMINAL]
            query.append(("limit", 1000))
            listed = api.get("/api/rollouts", params=query)
            assert listed.status_code == 200, listed.text
            unfinished = len(listed.json())
            if unfinished < IN_FLIGHT:
                items = next_items(IN_FLIGHT - unfinished)
                assert api.post("/api/rollouts", json=items).status_code == 201
                created += len(items)
            time.sleep(0.25)
        seconds = time.monotonic() - began
        page = api.get(f"/api/releases/{release_id}/observations", params={"limit": 10_000})
        observations = page.json()
    return Outcome(release, created, seconds, observations)


def report(name: str, outcome: Outcome) -> None:
    """The figures docs/release.md quotes, printed for `pytest -s`."""
    arms = {
        arm: [o["reward"] or 0.0 for o in outcome.observations if o["arm"] == arm and o["finished"]]
        for arm in ("candidate", "baseline")
    }
    means = {arm: round(sum(r) / len(r), 3) if r else None for arm, r in arms.items()}
    print(
        f"\n{name}: {outcome.release['state']} after {len(outcome.observations)} release rollouts "
        f"({outcome.created} created, {outcome.seconds:.0f}s), candidate {len(arms['candidate'])} "
        f"mean {means['candidate']}, baseline {len(arms['baseline'])} mean {means['baseline']}; "
        f"{outcome.release['reason']}"
    )

"""The agent SDK against a real `keraunos gateway`: rewards and events land on the agent's attempt."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import keraunos
from keraunos.agent import AsyncEventClient, EventRejectedError, emit_event, emit_reward
from keraunos.testing.processes import Gateway, unique_id

AgentEnviron = Callable[..., dict[str, str]]


def events(gateway: Gateway, rollout_id: str, fmt: str = "") -> list[dict]:
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": fmt} if fmt else {})
        assert response.status_code == 200, response.text
        return response.json()


def test_a_reward_posted_with_the_agent_token_is_stored_on_the_attempt(
    gateway: Gateway, in_agent: dict[str, str]
) -> None:
    stored = emit_reward(0.75, reason="close", source="unit")
    rollout_id = stored["rollout_id"]
    assert in_agent["AGL_EVENT_URL"].endswith(f"/api/rollouts/{rollout_id}/attempt/0/events")
    assert [e["data"] for e in events(gateway, rollout_id)] == [
        {"value": 0.75, "reason": "close", "source": "unit"}
    ]


def test_several_rewards_are_kept_in_order_and_the_last_is_final(
    gateway: Gateway, in_agent: dict[str, str]
) -> None:
    emit_reward(0.1, message="intermediate")
    emit_event("tool_call", {"name": "calc", "ok": True})
    emit_reward(1)
    rollout_id = in_agent["AGL_EVENT_URL"].split("/")[-4]
    triplets = events(gateway, rollout_id, "triplet")
    assert [(e["event_type"], e["data"]) for e in triplets] == [
        ("reward", {"value": 0.1}),
        ("tool_call", {"name": "calc", "ok": True}),
        ("reward", {"value": 1.0}),
    ]


def test_the_async_client_posts_the_same_events(gateway: Gateway, agent_environ: AgentEnviron) -> None:
    from keraunos.agent import AgentEnv

    env = AgentEnv.read(agent_environ())

    async def agent() -> None:
        async with AsyncEventClient(env) as client:
            await client.emit_event("step", {"i": 1})
            await client.emit_reward(-0.5)

    asyncio.run(agent())
    assert [e["event_type"] for e in events(gateway, env.rollout_id)] == ["step", "reward"]


def test_a_superseded_attempt_is_told_so_at_once_without_retries(
    gateway: Gateway, agent_environ: AgentEnviron
) -> None:
    from keraunos.agent import AgentEnv, EventClient, RetryPolicy

    rollout_id = unique_id("agent")
    with gateway.client() as api:
        api.post("/api/rollouts", json=[{"rollout_id": rollout_id, "input": 1}]).raise_for_status()
        env = AgentEnv.read(agent_environ("1", rollout_id))
        api.patch(f"/api/rollouts/{rollout_id}", json={"status": {"last_attempt_id": "2"}}).raise_for_status()
    with (
        EventClient(env, retry=RetryPolicy(attempts=3, initial_backoff_s=5.0)) as client,
        pytest.raises(EventRejectedError, match=r"\(409\): attempt superseded") as info,
    ):
        client.emit_reward(1.0)
    assert info.value.status == 409


def test_an_unreachable_gateway_gives_up_after_the_configured_tries(free_port) -> None:
    from keraunos.agent import AgentEnv, EventClient, RetryPolicy

    base = f"http://127.0.0.1:{free_port()}"
    env = AgentEnv(
        f"{base}/proxy/rollout/r/attempt/0/mode/train/openai/v1",
        f"{base}/api/rollouts/r/attempt/0/events",
        "k",
        "r",
        "0",
    )
    with (
        EventClient(env, retry=RetryPolicy(attempts=2, initial_backoff_s=0.01, timeout_s=2)) as client,
        pytest.raises(EventRejectedError, match="after 2 tries: ConnectError") as info,
    ):
        client.emit_reward(1.0)
    assert info.value.status is None


BARE_AGENT = """
import sys
import keraunos.agent as agent
stored = agent.emit_reward(0.5, source="bare")
heavy = sorted(m for m in ("pydantic", "numpy", "orjson", "structlog", "typer", "yaml", "fastapi") if m in sys.modules)
mine = sorted(m for m in sys.modules if m.startswith("keraunos") and not m.startswith("keraunos.agent") and m not in ("keraunos", "keraunos.errors"))
print(json_dumps({"stored": stored["data"], "heavy": heavy, "keraunos": mine}))
""".replace("json_dumps", "__import__('json').dumps")


def httpx_runtime_packages(closed_url: str) -> list[Path]:
    """The directories or modules of the third-party packages `import httpx` loads (httpx included)."""
    probe = (
        "import httpx, json, sys\n"
        "try:\n"
        "    httpx.post(sys.argv[1], json={})\n"  # transports import their dependencies lazily
        "except httpx.TransportError:\n"
        "    pass\n"
        "paths = {}\n"
        "for name, module in list(sys.modules.items()):\n"
        "    top = name.split('.')[0]\n"
        "    file = getattr(sys.modules.get(top), '__file__', None)\n"
        "    if top not in sys.stdlib_module_names and file and 'site-packages' in file:\n"
        "        paths[top] = file\n"
        "print(json.dumps(paths))"
    )
    found = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe, closed_url], capture_output=True, text=True, check=True
        ).stdout
    )
    return [Path(f).parent if Path(f).name == "__init__.py" else Path(f) for f in found.values()]


def test_the_sdk_works_where_only_httpx_is_installed(
    tmp_path: Path, in_agent: dict[str, str], free_port
) -> None:
    """No site-packages at all: only the standard library, httpx with its own dependencies, and keraunos."""
    site = tmp_path / "site"
    site.mkdir()
    for package in httpx_runtime_packages(f"http://127.0.0.1:{free_port()}/"):
        (site / package.name).symlink_to(package)
    (site / "keraunos").symlink_to(Path(keraunos.__file__).parent)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site), **in_agent}
    result = subprocess.run(
        [sys.executable, "-S", "-s", "-c", BARE_AGENT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"stored": {"value": 0.5, "source": "bare"}, "heavy": [], "keraunos": []}
    # The isolation is real: the same interpreter cannot import what the SDK must not need.
    blocked = subprocess.run(
        [sys.executable, "-S", "-s", "-c", "import pydantic"],
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert blocked.returncode != 0
    assert httpx.__name__ == "httpx"

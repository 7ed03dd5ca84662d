"""`keraunos resource stats` against a real gateway: per-version statistics as an operator reads them
(docs/release.md#per-version-statistics). The command runs in a subprocess with a clean environment
on a `keraunos gateway` process of the module's own, whose rollouts the test creates and finishes
through the HTTP routes; and how `--since`/`--until` read a time."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from keraunos.release.registry_cli import parse_time
from keraunos.testing.processes import Gateway, free_port, unique_id

Cli = Callable[..., subprocess.CompletedProcess[str]]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def stats_gateway(session_gateway_factory: Callable[..., Gateway]) -> Gateway:
    """A gateway of this module's own (a claim takes the oldest queued rollouts of the gateway)."""
    return session_gateway_factory()


def using(gateway: Gateway) -> dict[str, str]:
    return {"KERAUNOS_GATEWAY_URL": gateway.base_url, "KERAUNOS_GATEWAY_KEY": gateway.key}


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def rollouts_with_rewards(api: httpx.Client, rewards_by_version: dict[int, list[float | None]]) -> str:
    """A prompt resource with versions 1 and 2, and for each version one finished rollout per
    reward (None: failed without one); its name."""
    name = unique_id("prompt")
    for template in ("Answer: {question}", "Think, then answer: {question}"):
        assert (
            api.post(
                f"/api/resources/{name}", json={"kind": "prompt", "content": {"template": template}}
            ).status_code
            == 201
        )
    plan = [(version, reward) for version, rewards in rewards_by_version.items() for reward in rewards]
    items = [{"input": i, "resources": {name: version}} for i, (version, _) in enumerate(plan)]
    assert api.post("/api/rollouts", json=items).status_code == 201
    claimed = api.post(
        "/api/rollouts/claim", json={"controller_id": "cli-test", "count": len(plan), "lease_seconds": 60}
    ).json()
    assert len(claimed) == len(plan)
    for claim, (_, reward) in zip(claimed, plan, strict=True):
        base = f"/api/rollouts/{claim['rollout']['rollout_id']}/attempt/{claim['attempt_id']}"
        if reward is not None:
            event = {"event_type": "reward", "data": {"value": reward}}
            assert api.post(f"{base}/events", json=event).status_code == 200
        outcome = "failed" if reward is None else "succeeded"
        assert (
            api.post(f"{base}/finish", json={"outcome": outcome, "controller_id": "cli-test"}).status_code
            == 200
        )
    return name


def test_stats_print_a_table_per_version_and_the_same_numbers_as_json(
    cli: Cli, stats_gateway: Gateway
) -> None:
    with stats_gateway.client() as api:
        name = rollouts_with_rewards(api, {1: [1.0, 0.0, 1.0, None], 2: [0.5, 0.25]})
    env = using(stats_gateway)

    answer = json.loads(ok(cli("resource", "stats", name, "--since", "1h", "--json", env=env)))

    one, two = answer["versions"]
    assert (one["version"], one["rollouts"], one["failed"], one["rewarded"], one["reward_mean"]) == (
        1,
        4,
        1,
        3,
        2 / 3,
    )
    assert (two["version"], two["rollouts"], two["failed"], two["rewarded"], two["reward_mean"]) == (
        2,
        2,
        0,
        2,
        0.375,
    )
    assert answer["until"] is None and answer["since"] is not None

    table = ok(cli("resource", "stats", name, env=env))
    assert f"{name}: rollouts created from the start until now" in table
    assert "95% interval" in table
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.count("│") > 5}
    assert {"1", "2"} <= set(rows)
    assert "0.667" in rows["1"] and "1 (25.0%)" in rows["1"]
    assert "0.375" in rows["2"] and "0 (0.0%)" in rows["2"]

    later = ok(cli("resource", "stats", name, "--since", "2999-01-01T00:00", env=env))
    assert "no rollouts of this resource were created in the window" in later


def test_an_unknown_resource_or_a_time_that_is_none_is_one_line_and_exit_2(
    cli: Cli, stats_gateway: Gateway
) -> None:
    env = using(stats_gateway)

    assert "Resource not found" in refused(cli("resource", "stats", unique_id("none"), env=env), 2)
    line = refused(cli("resource", "stats", "system", "--since", "yesterday", env=env), 2)
    assert line.startswith("error: --since 'yesterday' is not a time: give a duration back from now")
    refused(cli("resource", "stats", "system", "--since", "2h", "--until", "3h", env=env), 2)  # empty window


def test_an_unreachable_gateway_is_exit_1(cli: Cli) -> None:
    refused(cli("resource", "stats", "system", "--gateway", f"http://127.0.0.1:{free_port()}"), 1)


def test_a_time_is_a_duration_back_from_now_a_date_and_time_or_unix_seconds() -> None:
    now = 1_764_590_400.0  # 2025-12-01T12:00:00Z
    assert parse_time("90s", now) == now - 90
    assert parse_time("30m", now) == now - 1800
    assert parse_time("1.5h", now) == now - 5400
    assert parse_time("2d", now) == now - 2 * 86400
    assert parse_time("1w", now) == now - 7 * 86400
    assert parse_time("1764489600.5", now) == 1764489600.5
    assert parse_time("2026-12-01T10:00", now) == datetime(2026, 12, 1, 10, tzinfo=UTC).timestamp()
    assert parse_time("2026-12-01T10:00+02:00", now) == datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp()
    for text in ("yesterday", "1y", "nan", "inf", ""):
        with pytest.raises(ValueError, match="is not a time"):
            parse_time(text, now)

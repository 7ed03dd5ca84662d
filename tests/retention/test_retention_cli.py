"""`keraunos retention purge` (keraunos/retention/main.py) against a real gateway: the dry run's
table, the purge's sizes and audit entry, and one-line errors with their exit status."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from retention_support import KEYS, finished

from keraunos.retention.main import parse_duration
from keraunos.testing.processes import Gateway

pytestmark = pytest.mark.timeout(120)

Cli = Callable[..., subprocess.CompletedProcess[str]]


def purge(cli: Cli, gateway: Gateway, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    return cli(
        "retention",
        "purge",
        *args,
        "--gateway",
        gateway.base_url,
        "--key",
        key if key is not None else gateway.key,
    )


def one_line_error(result: subprocess.CompletedProcess[str], status: int, *parts: str) -> None:
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45", 45.0),
        ("45s", 45.0),
        ("90m", 5400.0),
        ("12h", 43200.0),
        ("30d", 2592000.0),
        ("2w", 1209600.0),
        ("1.5h", 5400.0),
    ],
)
def test_durations_take_a_number_and_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_dry_run_prints_what_would_go_and_what_is_kept_by_protection_and_deletes_nothing(
    cli: Cli, keyed: Gateway
) -> None:
    with keyed.client() as api:
        val, unconsumed = finished(api, {"is_train": False}, {})

        result = purge(cli, keyed, "--older-than", "0", "--dry-run", "--show", "1000")

        assert result.returncode == 0, result.stderr
        assert "would delete" in result.stdout
        assert "kept: awaiting_training" in result.stdout
        assert val in result.stdout and unconsumed in result.stdout
        assert "nothing deleted (dry run)" in result.stdout
        assert api.get(f"/api/rollouts/{val}").status_code == 200


def test_a_purge_reports_json_with_the_sizes_and_its_audit_entry(cli: Cli, keyed: Gateway) -> None:
    with keyed.client() as api:
        (val,) = finished(api, {"is_train": False, "state": "failed"})

        result = purge(cli, keyed, "--mode", "val", "--state", "failed", "--json")

        assert result.returncode == 0, result.stderr
        made = json.loads(result.stdout)
        assert val in [i["rollout_id"] for i in made["items"] if i["action"] == "delete"]
        assert (
            made["audit_seq"] >= 1 and made["bytes_reclaimed"] == made["bytes_before"] - made["bytes_after"]
        )
        assert api.get(f"/api/rollouts/{val}").status_code == 404


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (("--older-than", "30x"), ("--older-than", "not a duration")),
        ((), ("selects every terminal rollout", "--older-than 0 takes them all")),
        (("--state", "running"), ("--state", "not terminal")),
    ],
)
def test_a_bad_policy_is_a_one_line_error_and_exit_2(
    cli: Cli, keyed: Gateway, args: tuple[str, ...], parts: tuple[str, ...]
) -> None:
    one_line_error(purge(cli, keyed, *args), 2, *parts)


def test_force_with_a_trainers_key_is_refused_in_one_line_and_exit_2(cli: Cli, keyed: Gateway) -> None:
    result = purge(cli, keyed, "--older-than", "0", "--force", key=KEYS["trainer-1"][1])
    one_line_error(result, 2, "403", "may not force a purge")


def test_an_unreachable_gateway_is_a_one_line_error_and_exit_1(
    cli: Cli, free_port: Callable[[], int]
) -> None:
    result = cli("retention", "purge", "--older-than", "30d", "--gateway", f"http://127.0.0.1:{free_port()}")
    one_line_error(result, 1, "POST http://127.0.0.1:")

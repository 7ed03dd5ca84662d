"""`keraunos release` where no gateway is needed to tell: a bad plan, replay file or flag is one line
and exit status 2 before anything is sent, and an unreachable gateway is one line and exit 1. The
commands against a real gateway are in test_release_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from keraunos.release.release_cli import release_app

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(release_app(), list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--stages", "0.5,0.2"], "plan: stage shares must increase"),
        (["--stages", "0.2,fast"], "--stages"),
        (["--stages", "0.2,1.0"], "strictly between 0 and 1"),
        (["--replay-pairs", "5"], "--replay-file"),
    ],
    ids=["decreasing", "not-a-number", "a-stage-of-100-percent", "pairs-without-inputs"],
)
def test_a_plan_that_cannot_work_is_refused_in_one_line_before_anything_is_sent(
    flags: list[str], names: str
) -> None:
    status, output = invoke("start", "system_prompt", "--candidate", "2", "--gateway", NOWHERE, *flags)
    assert status == 2
    assert output.startswith("error: ") and names in output and output.count("\n") == 1


def test_a_plan_file_with_an_unknown_field_names_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("stages: [0.1, 0.3]\nmin_stage_rolouts: 20\n")
    status, output = invoke("start", "p", "--candidate", "2", "--plan", str(plan), "--gateway", NOWHERE)
    assert status == 2 and "min_stage_rolouts" in output and output.count("\n") == 1


def test_a_replay_file_line_that_is_not_a_rollout_names_its_line(tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text('{"input": {"question": "1+1"}}\n\n{"inputs": 3}\n')
    status, output = invoke(
        "start", "p", "--candidate", "2", "--replay-file", str(items), "--gateway", NOWHERE
    )
    assert status == 2 and f"{items}:3" in output


def test_an_unreachable_gateway_is_one_line_and_exit_status_1(tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text('{"input": {"question": "1+1"}}\n')
    for args in (
        ["start", "p", "--candidate", "2", "--replay-file", str(items)],
        ["status"],
        ["approve", "rel-1"],
        ["run", "--once"],
    ):
        status, output = invoke(*args, "--gateway", NOWHERE)
        assert status == 1, (args, output)
        assert "error" in output and "Traceback" not in output


def test_run_refuses_a_poll_interval_slower_than_a_third_of_the_lease_in_one_line() -> None:
    status, output = invoke("run", "--once", "--poll-interval-s", "20", "--lease-s", "30")
    assert status == 2 and "poll_interval_s" in output and output.count("\n") == 1


@pytest.mark.parametrize("command", ["start", "status", "approve", "abort", "rollback", "run"])
def test_every_release_command_explains_itself_with_its_gateway_key_and_json_options(command: str) -> None:
    status, output = invoke(command, "--help")
    text = " ".join(output.split())
    assert status == 0
    for option in ("--gateway", "--key", "--json", "KERAUNOS_GATEWAY_URL", "KERAUNOS_GATEWAY_KEY"):
        assert option in text
    if command == "run":
        assert "--once" in text and "KERAUNOS_RELEASE_RUNNER_LEASE_S" in text

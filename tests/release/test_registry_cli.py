"""`keraunos resource` and `keraunos audit` against a real gateway: what an operator types and sees.

Every command runs as a user runs it (`keraunos ...` in a subprocess with a clean environment) on a
`keraunos gateway` process with its own SQLite file; `keraunos audit verify --db` reads that file
after the gateway has stopped, and again after one audit row was edited with plain sqlite3.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from keraunos.testing.processes import Gateway, free_port, unique_id

Cli = Callable[..., subprocess.CompletedProcess[str]]
StartGateway = Callable[..., Gateway]


@pytest.fixture(scope="module")
def registry(session_gateway_factory: StartGateway) -> Gateway:
    """One gateway for this module's commands (resource names are unique per test)."""
    return session_gateway_factory()


def using(gateway: Gateway) -> dict[str, str]:
    """The environment that points every command at `gateway` (as an operator's shell would)."""
    return {"KERAUNOS_GATEWAY_URL": gateway.base_url, "KERAUNOS_GATEWAY_KEY": gateway.key}


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], status: int) -> str:
    """The one line of a failed command, after checking its exit status."""
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- help ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("resource", "push"),
        ("resource", "list"),
        ("resource", "show"),
        ("resource", "diff"),
        ("resource", "label"),
        ("resource", "stats"),
        ("audit",),
        ("audit", "verify"),
    ],
    ids=" ".join,
)
def test_every_command_explains_itself_with_the_gateway_key_and_json_options(
    cli: Cli, command: tuple[str, ...]
) -> None:
    text = " ".join(ok(cli(*command, "--help")).split())
    for option in ("--gateway", "--key", "--json", "KERAUNOS_GATEWAY_URL", "KERAUNOS_GATEWAY_KEY"):
        assert option in text
    assert "http://127.0.0.1:8000" in text  # the controller's default gateway too


def test_the_top_level_help_lists_resource_and_audit(cli: Cli) -> None:
    out = ok(cli("--help"))
    assert "resource" in out and "audit" in out


# -- resource -----------------------------------------------------------------------------------------


def test_push_show_diff_and_label_a_prompt_through_the_gateway(
    cli: Cli, registry: Gateway, tmp_path: Path
) -> None:
    env = using(registry)
    name = unique_id("prompt")
    first = ok(
        cli(
            "resource",
            "push",
            name,
            "--kind",
            "prompt",
            "--template",
            "Add the numbers.",
            "-m",
            "v1",
            env=env,
        )
    )
    assert first.startswith(f"pushed {name}@1 (sha256:")
    assert ok(
        cli("resource", "push", name, "--kind", "prompt", "--template", "Add the numbers.", env=env)
    ).startswith(f"unchanged: {name}@1 already has this content")
    template = tmp_path / "prompt.txt"
    template.write_text("Add the numbers.\nShow your work.\n")
    second = json.loads(
        ok(
            cli(
                "resource",
                "push",
                name,
                "--kind",
                "prompt",
                "--template-file",
                str(template),
                "--json",
                env=env,
            )
        )
    )
    assert (second["created"], second["version"]["version"], second["version"]["parent"]) == (True, 2, 1)

    assert ok(
        cli("resource", "label", name, "candidate", "2", "--expected", "0", "--reason", "try it", env=env)
    ) == (f"{name} candidate -> 2\n")
    history = ok(cli("resource", "show", name, env=env))
    assert "candidate" in history and "v1" in history
    one = json.loads(ok(cli("resource", "show", f"{name}@candidate", "--json", env=env)))
    assert (one["version"], one["content"]) == (2, {"template": "Add the numbers.\nShow your work.\n"})
    assert ok(cli("resource", "show", f"{name}@1", env=env)).rstrip().endswith("Add the numbers.")

    diff = ok(cli("resource", "diff", name, "1", "candidate", env=env))
    assert {"-Add the numbers.", "\\ No newline at end of file", "+Show your work."} <= set(diff.splitlines())

    listed = {item["name"]: item for item in json.loads(ok(cli("resource", "list", "--json", env=env)))}
    assert (listed[name]["latest"], listed[name]["labels"]) == (2, {"candidate": 2})


def test_a_sampling_config_is_pushed_from_a_yaml_file(cli: Cli, registry: Gateway, tmp_path: Path) -> None:
    config = tmp_path / "sampling.yaml"
    config.write_text("temperature: 0.3\nmax_tokens: 64\n")
    name = unique_id("sampling")
    pushed = json.loads(
        ok(
            cli(
                "resource",
                "push",
                name,
                "--kind",
                "sampling",
                "--file",
                str(config),
                "--json",
                env=using(registry),
            )
        )
    )
    assert pushed["version"]["content"] == {"temperature": 0.3, "max_tokens": 64}


def test_a_label_move_whose_expected_version_is_stale_is_refused_in_one_line(
    cli: Cli, registry: Gateway
) -> None:
    env = using(registry)
    name = unique_id("prompt")
    for text in ("one", "two"):
        ok(cli("resource", "push", name, "--kind", "prompt", "--template", text, env=env))
    ok(cli("resource", "label", name, "production", "1", env=env))
    line = refused(cli("resource", "label", name, "production", "2", "--expected", "2", env=env), 2)
    assert "409" in line
    assert json.loads(ok(cli("resource", "show", f"{name}@production", "--json", env=env)))["version"] == 1


def test_a_read_only_key_reads_the_registry_but_cannot_move_a_label(
    cli: Cli, gateway_factory: StartGateway, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: auditor, role: reader, key: reader-key-0123456789}]\n")
    gateway = gateway_factory(args=("--keys-file", str(keys)))
    env = using(gateway)
    ok(cli("resource", "push", "system_prompt", "--kind", "prompt", "--template", "hello", env=env))
    reader = {**env, "KERAUNOS_GATEWAY_KEY": "reader-key-0123456789"}
    assert "system_prompt" in ok(cli("resource", "list", env=reader))
    assert ok(cli("audit", "verify", env=reader)).startswith("audit log ok: 1 entry,")
    line = refused(cli("resource", "label", "system_prompt", "production", "1", env=reader), 2)
    assert "403" in line
    assert json.loads(ok(cli("resource", "show", "system_prompt", "--json", env=env)))["labels"] == []


def test_an_unknown_resource_is_the_callers_mistake_exit_2(cli: Cli, registry: Gateway) -> None:
    line = refused(cli("resource", "show", unique_id("nothing"), env=using(registry)), 2)
    assert "404" in line and "not found" in line.lower()


def test_content_that_does_not_fit_its_kind_is_refused_before_anything_is_sent(
    cli: Cli, tmp_path: Path
) -> None:
    config = tmp_path / "bad.json"
    config.write_text('{"temperature": 99}')
    unreachable = f"http://127.0.0.1:{free_port()}"
    line = refused(
        cli("resource", "push", "s", "--kind", "sampling", "--file", str(config), "--gateway", unreachable), 2
    )
    assert "temperature" in line
    line = refused(
        cli("resource", "push", "s", "--kind", "weights", "--template", "x", "--gateway", unreachable), 2
    )
    assert "--file" in line


def test_an_unreachable_gateway_is_a_runtime_failure_exit_1(cli: Cli) -> None:
    line = refused(cli("resource", "list", "--gateway", f"http://127.0.0.1:{free_port()}"), 1)
    assert "/api/resources" in line


# -- audit --------------------------------------------------------------------------------------------


def test_audit_lists_the_pushes_and_label_moves_and_verify_passes_with_the_head(
    cli: Cli, registry: Gateway
) -> None:
    env = using(registry)
    name = unique_id("prompt")
    ok(cli("resource", "push", name, "--kind", "prompt", "--template", "hello", env=env))
    ok(cli("resource", "label", name, "production", "1", "--reason", "first release", env=env))

    page = json.loads(ok(cli("audit", "--limit", "500", "--json", env=env)))
    mine = [entry for entry in page["items"] if name in entry["subject"]]
    assert [entry["action"] for entry in mine] == ["resource.push", "label.move"]
    assert mine[1]["reason"] == "first release"
    assert "label.move" in ok(cli("audit", "--after", str(mine[0]["seq"]), "--limit", "1", env=env))

    checked = json.loads(ok(cli("audit", "verify", "--json", env=env)))
    assert checked["ok"] and checked["problems"] == [] and checked["checked"] == checked["count"] >= 2
    out = ok(cli("audit", "verify", "--expect-head", checked["head"], env=env))
    assert out.startswith("audit log ok: ") and checked["head"] in out

    wrong = "sha256:" + "f" * 64
    broken = cli("audit", "verify", "--expect-head", wrong, env=env)
    assert broken.returncode == 1, broken.stderr
    assert f"no entry has the expected head hash {wrong}" in broken.stdout


def test_verify_db_passes_on_an_untouched_ledger_and_names_the_entry_edited_in_the_file(
    cli: Cli, gateway_factory: StartGateway
) -> None:
    gateway = gateway_factory()
    env = using(gateway)
    for text in ("one", "two", "three"):
        ok(cli("resource", "push", "system_prompt", "--kind", "prompt", "--template", text, env=env))
    ok(cli("resource", "label", "system_prompt", "production", "2", env=env))
    db = str(gateway.db)

    line = refused(cli("audit", "verify", "--db", db), 1)  # the running gateway holds the file
    assert "--gateway" in line

    assert gateway.stop() == 0
    assert ok(cli("audit", "verify", "--db", db)).startswith("audit log ok: 4 entries, head sha256:")

    with sqlite3.connect(db) as conn:
        assert conn.execute("UPDATE audit_log SET reason = 'nothing to see' WHERE seq = 2").rowcount == 1
    conn.close()
    broken = cli("audit", "verify", "--db", db)
    assert broken.returncode == 1, broken.stderr
    assert "entry 2: its content does not match its hash (edited)" in broken.stdout
    assert "entry 3" not in broken.stdout  # the later links still point at the stored hash


def test_verify_db_of_a_file_that_does_not_exist_is_bad_input(cli: Cli, tmp_path: Path) -> None:
    line = refused(cli("audit", "verify", "--db", str(tmp_path / "missing.db")), 2)
    assert "missing.db" in line
    assert not (tmp_path / "missing.db").exists()

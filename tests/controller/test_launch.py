"""Pure decisions of the controller: the agent environment, what to start, timeouts, endings, protocol."""

from __future__ import annotations

import json
import signal
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.controller.config import ConfigError, ControllerConfig
from keraunos.controller.environment import EnvMapError, agent_environment, resolve_env_map
from keraunos.controller.launch import (
    AGENT_MAIN,
    Defaults,
    LaunchError,
    agent_argv,
    attempt_timeout_s,
    plan_launch,
)
from keraunos.controller.main import StartupError, choose_protocol
from keraunos.controller.runners.local import AgentExit
from keraunos.controller.work import ending_of, last_line

GATEWAY = "http://127.0.0.1:9"


def environment(**overrides: object) -> dict[str, str]:
    arguments: dict[str, object] = {
        "gateway": GATEWAY,
        "rollout_id": "r-1",
        "attempt_id": "2",
        "is_train": True,
        "agent_key": "kat1.token",
        "env_map": {},
        "rollout_input": {},
    }
    arguments.update(overrides)
    return agent_environment({"PATH": "/bin", "HOME": "/h"}, **arguments)  # type: ignore[arg-type]


def test_the_contract_variables_name_the_attempt_and_its_mode() -> None:
    env = environment()
    assert env["AGL_OPENAI_BASE_URL"] == f"{GATEWAY}/proxy/rollout/r-1/attempt/2/mode/train/openai/v1"
    assert env["AGL_EVENT_URL"] == f"{GATEWAY}/api/rollouts/r-1/attempt/2/events"
    assert env["AGL_KEY"] == "kat1.token"
    assert environment(is_train=False)["AGL_OPENAI_BASE_URL"].endswith("/mode/val/openai/v1")


def test_the_controllers_own_settings_and_secrets_never_reach_the_agent() -> None:
    base = {"PATH": "/bin", "KERAUNOS_CONTROLLER_KEY": "server-key", "AGL_KEY": "old", "AGL_OTHER": "x"}
    env = agent_environment(
        base,
        gateway=GATEWAY,
        rollout_id="r",
        attempt_id="1",
        is_train=True,
        agent_key="tok",
        env_map={},
        rollout_input=None,
    )
    assert env == {
        "PATH": "/bin",
        "AGL_OPENAI_BASE_URL": f"{GATEWAY}/proxy/rollout/r/attempt/1/mode/train/openai/v1",
        "AGL_EVENT_URL": f"{GATEWAY}/api/rollouts/r/attempt/1/events",
        "AGL_KEY": "tok",
    }


def test_without_auth_agents_get_the_key_unused() -> None:
    assert environment(agent_key="")["AGL_KEY"] == "unused"


def test_env_map_reads_input_paths_and_keeps_literals() -> None:
    rollout_input = {"q": "why?", "n": 3, "items": [{"id": "a"}, {"id": "b"}], "nested": {"k": [1, 2]}}
    env_map = {
        "Q": "input.q",
        "N": "input.n",
        "ID": "input.items.1.id",
        "ALL": "input",
        "MODE": "literal text",
    }
    resolved = resolve_env_map(env_map, rollout_input)
    assert resolved == {
        "Q": "why?",
        "N": "3",
        "ID": "b",
        "ALL": json.dumps(rollout_input),
        "MODE": "literal text",
    }


@pytest.mark.parametrize("path", ["input.missing", "input.items.5.id", "input.q.deeper", "input.items.x"])
def test_a_missing_env_map_path_is_an_error_naming_the_variable_and_the_path(path: str) -> None:
    with pytest.raises(EnvMapError) as caught:
        resolve_env_map({"VAR": path}, {"q": "x", "items": [{"id": "a"}]})
    assert "config.local.env_map.VAR" in str(caught.value)
    assert repr(path) in str(caught.value)


def test_env_map_may_not_set_the_contract_variables() -> None:
    with pytest.raises(EnvMapError, match="AGL_KEY"):
        resolve_env_map({"AGL_KEY": "input"}, {})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(JSON)
def test_the_whole_input_round_trips_through_json(rollout_input: object) -> None:
    (value,) = resolve_env_map({"X": "input"}, rollout_input).values()
    if isinstance(rollout_input, str):
        assert value == rollout_input
    else:
        assert json.loads(value) == rollout_input


def test_the_rollouts_command_wins_over_its_agent_class_and_the_controller_defaults() -> None:
    defaults = Defaults(agent_class="pkg:Default", command=("default-cmd",), python="/py")
    assert agent_argv({"command": ["node", "agent.js"], "agent_class": "m:C"}, defaults) == [
        "node",
        "agent.js",
    ]
    assert agent_argv({"agent_class": "m:C"}, defaults) == ["/py", "-m", AGENT_MAIN, "m:C"]
    assert agent_argv(None, defaults) == ["default-cmd"]
    assert agent_argv({}, Defaults(agent_class="pkg:Default", python="/py")) == [
        "/py",
        "-m",
        AGENT_MAIN,
        "pkg:Default",
    ]


def test_a_rollout_that_names_no_agent_without_a_default_cannot_start() -> None:
    with pytest.raises(LaunchError, match=r"config\.local\.agent_class"):
        agent_argv({"env_map": {}}, Defaults())


def test_timeout_is_the_rollouts_unless_left_at_the_protocol_default() -> None:
    defaults = Defaults(timeout_s=5.0)
    assert attempt_timeout_s({"timeout_seconds": 12}, defaults) == 12.0
    assert attempt_timeout_s({"timeout_seconds": 3600}, defaults) == 5.0
    assert attempt_timeout_s({}, defaults) == 5.0


def test_plan_launch_assembles_argv_env_and_timeout_from_the_wire_rollout() -> None:
    rollout = {
        "rollout_id": "r-7",
        "input": {"q": "hello"},
        "is_train": False,
        "config": {"timeout_seconds": 30, "local": {"agent_class": "m:C", "env_map": {"Q": "input.q"}}},
    }
    plan = plan_launch(rollout, "3", agent_key="tok", gateway=GATEWAY, defaults=Defaults(), base_env={})
    assert plan.argv == [sys.executable, "-m", AGENT_MAIN, "m:C"]
    assert plan.timeout_s == 30.0
    assert plan.env["Q"] == "hello"
    assert plan.env["AGL_EVENT_URL"] == f"{GATEWAY}/api/rollouts/r-7/attempt/3/events"


def test_endings_follow_exit_status_timeout_and_stop_requests() -> None:
    assert ending_of(AgentExit(0), 10, b"").outcome == "succeeded"
    failed = ending_of(AgentExit(1), 10, b"Traceback\n  ...\nRuntimeError: boom\n\n")
    assert (failed.outcome, failed.exit_code, failed.reason) == (
        "failed",
        1,
        "exited with code 1: RuntimeError: boom",
    )
    killed = ending_of(AgentExit(-signal.SIGSEGV), 10, b"")
    assert killed.reason == "killed by SIGSEGV"
    orphaned = ending_of(AgentExit(None), 10, b"")
    assert (orphaned.outcome, orphaned.exit_code) == ("failed", None)
    assert "unknown exit status" in (orphaned.reason or "")
    timed_out = ending_of(AgentExit(-signal.SIGKILL, timed_out=True), 2.5, b"")
    assert timed_out.outcome == "timed_out" and "2.5s" in (timed_out.reason or "")
    stopped = ending_of(AgentExit(-signal.SIGTERM, stopped="shutdown"), 10, b"")
    assert (stopped.outcome, stopped.reason) == ("lost", "shutdown")


def test_a_long_last_line_is_shortened() -> None:
    assert len(last_line(b"x" * 10_000)) == 300


def test_protocol_choice_follows_the_servers_features() -> None:
    assert choose_protocol("auto", ["attempts", "proxy"]) == "attempts"
    assert choose_protocol("auto", ["proxy"]) == "v1"
    assert choose_protocol("auto", None) == "v1"
    assert choose_protocol("v1", ["attempts"]) == "v1"
    with pytest.raises(StartupError, match=r"v1\.0 server"):
        choose_protocol("attempts", None)


def test_config_rejects_two_default_agents_and_bad_urls() -> None:
    with pytest.raises(ConfigError, match="at most one"):
        ControllerConfig.load({"agent_class": "m:C", "command": "node a.js"})
    with pytest.raises(ConfigError, match="gateway"):
        ControllerConfig.load({"gateway": "localhost:8000"})
    assert ControllerConfig.load({"command": "node 'my agent.js'"}).command_argv == ["node", "my agent.js"]

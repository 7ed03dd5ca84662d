"""`keraunos rereward` end to end: a real gateway holding rollouts that ran through its proxy, the
command in a subprocess, and as the judge a scripted OpenAI-compatible server (the cassette of
keraunos.testing, answering exactly the prompts the judge is sent), the engine stand-in and a real
`keraunos serve` of a tiny random model (whose replies are no JSON: groups left unscored, exit 0)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from rereward_support import HERE, store_groups

from keraunos._subprocess import stop_process
from keraunos.rereward.judge import JudgeModel, chat_request
from keraunos.rereward.run import read_member
from keraunos.rereward.scorers import JudgementError, judge_messages, parse_judgement, retry_messages
from keraunos.testing.cassette import CassetteConfig, CassetteServer, cassette_key, start_cassette
from keraunos.testing.processes import Engine, Gateway, clean_env, free_port, keraunos_command, unique_id
from keraunos.training._read import read_events

pytestmark = pytest.mark.timeout(180)

Cli = Callable[..., subprocess.CompletedProcess[str]]
JUDGE = "judge/model"
RUBRIC = "The trajectory whose final answer is right wins."


def terminal_count(gateway: Gateway) -> int:
    with gateway.client() as api:
        return int(api.get("/api/rollouts/terminal", params={"limit": 1}).json()["total_terminal"])


def events_of(gateway: Gateway, rollout_id: str, **params: str) -> list[dict[str, Any]]:
    with gateway.client() as api:
        return api.get(f"/api/rollouts/{rollout_id}/events", params=params).json()


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["event_type"] == kind]


def judge_prompt(gateway: Gateway, ids: list[str]) -> list[dict[str, Any]]:
    """The prompt the judge must be sent for the group `ids`, from what the ledger holds."""
    records = []
    with gateway.client() as api:
        for rid in ids:
            rollout = api.get(f"/api/rollouts/{rid}").json()["rollout"]
            records.append(read_member(rollout, api.get(f"/api/rollouts/{rid}/events").json())[0])
    return judge_messages(records, RUBRIC)


def answer(content: str) -> dict[str, Any]:
    return {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


def scores(*values: float) -> str:
    entries = [
        {"trajectory_id": str(i), "explanation": f"judged {v}", "score": v} for i, v in enumerate(values, 1)
    ]
    return json.dumps({"scores": entries})


@pytest.fixture
def cassette(tmp_path: Path) -> Iterator[Callable[[list[tuple[list[dict[str, Any]], str]]], CassetteServer]]:
    """`cassette([(prompt, reply), ...])`: a judge answering exactly those prompts, no other."""
    started: list[CassetteServer] = []

    def start(calls: list[tuple[list[dict[str, Any]], str]]) -> CassetteServer:
        path = tmp_path / f"judge{len(started)}.jsonl"
        model = JudgeModel(base_url="http://judge/v1", model=JUDGE)
        with path.open("wb") as out:
            for messages, reply in calls:
                request = chat_request(model, messages)
                line = {"key": cassette_key(request), "request": request, "response": answer(reply)}
                out.write(orjson.dumps(line) + b"\n")
        server = start_cassette(CassetteConfig(path=path, port=0))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def rereward(
    cli: Cli, gateway: Gateway, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return cli("rereward", "--gateway", gateway.base_url, "--key", gateway.key, *args, env=env, timeout=120)


def test_a_judge_version_is_recorded_beside_the_agents_reward_and_a_second_run_only_skips(
    stack: Gateway, cli: Cli, cassette: Callable[..., CassetteServer]
) -> None:
    before = terminal_count(stack)
    prefix = unique_id("judge")
    ids = store_groups(stack, {"q1": [1.0, 0.0, 0.0], "q2": [0.0, 1.0]}, prefix=prefix)
    first, second = ids[:3], ids[3:]
    bad = "Trajectory 2 looks best to me."
    with pytest.raises(JudgementError) as problem:
        parse_judgement(bad, 2)
    second_prompt = judge_prompt(stack, second)
    judge = cassette(
        [
            (judge_prompt(stack, first), scores(0.2, 0.9, 0.5)),
            (second_prompt, bad),  # asked again once, told why
            (retry_messages(second_prompt, bad, str(problem.value)), scores(0.7, 0.1)),
        ]
    )
    judge_args = ("--judge-base-url", judge.api_root, "--judge-model", JUDGE, "--judge-rubric", RUBRIC)

    result = rereward(cli, stack, "--version", "judge-v1", *judge_args, "--after", str(before))

    assert result.returncode == 0, result.stderr
    assert "5 rollouts in 2 groups" in result.stdout
    assert "scored 5, skipped 0 (already had the version), not scored 0" in result.stdout
    assert "old 0.400 -> new 0.480" in result.stdout
    judge.check_no_misses()
    for rid, old, new in zip(ids, [1.0, 0.0, 0.0, 0.0, 1.0], [0.2, 0.9, 0.5, 0.7, 0.1], strict=True):
        events = events_of(stack, rid)
        assert of_type(events, "reward") == [{"value": old}]  # the agent's reward, untouched
        assert of_type(events, "reward_version") == [
            {
                "version": "judge-v1",
                "value": new,
                "source": "rereward",
                "judge": {"model": JUDGE, "endpoint": judge.api_root},
                "reason": f"judged {new}",
            }
        ]

    again = rereward(cli, stack, "--version", "judge-v1", *judge_args, "--after", str(before))
    assert again.returncode == 0, again.stderr
    assert "scored 0, skipped 5" in again.stdout
    assert all(len(of_type(events_of(stack, rid), "reward_version")) == 1 for rid in ids)
    judge.check_no_misses()


def test_two_reward_versions_coexist_and_the_trainers_read_of_the_triplet_view_picks_the_chosen_one(
    stack: Gateway, cli: Cli, cassette: Callable[..., CassetteServer]
) -> None:
    prefix = unique_id("two")
    ids = store_groups(stack, {"q": [1.0, 0.0]}, prefix=prefix)
    judge = cassette([(judge_prompt(stack, ids), scores(0.3, 0.6))])
    judged = rereward(
        cli, stack, "--version", "judge-v1", "--judge-base-url", judge.api_root, "--judge-model", JUDGE,
        "--judge-rubric", RUBRIC, "--rollout-ids", ",".join(ids), "--progress", "false",
    )  # fmt: skip
    env = {"PYTHONPATH": str(HERE)}
    flipped = rereward(
        cli, stack, "--version", "flipped-v1", "--callable", "rereward_fns:flipped",
        "--rollout-ids", ",".join(ids), "--progress", "false", env=env,
    )  # fmt: skip
    assert (judged.returncode, flipped.returncode) == (0, 0), judged.stderr + flipped.stderr
    assert "scored 2" in flipped.stdout

    for rid, old, by_judge in zip(ids, [1.0, 0.0], [0.3, 0.6], strict=True):
        versions = {d["version"]: d for d in of_type(events_of(stack, rid), "reward_version")}
        assert set(versions) == {"judge-v1", "flipped-v1"}
        # flipped: 1 - the agent's reward, + 0.01 per transcript message (user, assistant, tool, assistant)
        assert versions["flipped-v1"]["value"] == pytest.approx(1 - old + 0.04)
        assert versions["flipped-v1"]["callable"] == "rereward_fns:flipped"
        triplets = events_of(stack, rid, format="triplet", delta="1")
        assert read_events(triplets).reward == old
        assert read_events(triplets, reward_version="judge-v1").reward == by_judge
        assert read_events(triplets, reward_version="flipped-v1").reward == pytest.approx(1 - old + 0.04)


def test_the_window_and_the_filters_choose_which_rollouts_are_scored(stack: Gateway, cli: Cli) -> None:
    before = terminal_count(stack)
    ids = store_groups(stack, {"w": [1.0, 0.0, 1.0]}, prefix=unique_id("window"))
    env = {"PYTHONPATH": str(HERE)}
    window = ("--after", str(before + 1), "--until", str(before + 2), "--progress", "false")
    val_only = rereward(
        cli,
        stack,
        "--version",
        "w1",
        "--callable",
        "rereward_fns:flipped",
        *window,
        "--is-train",
        "false",
        env=env,
    )
    assert "0 rollouts in 0 groups" in val_only.stdout, val_only.stderr  # every one is a training rollout
    result = rereward(cli, stack, "--version", "w1", "--callable", "rereward_fns:flipped", *window, env=env)
    assert "1 rollouts in 1 groups" in result.stdout and "scored 1" in result.stdout, result.stderr
    scored = [rid for rid in ids if of_type(events_of(stack, rid), "reward_version")]
    assert scored == [ids[1]]  # terminal position before + 2 only


def test_the_engine_stand_in_as_judge_answers_no_json_so_groups_are_reported_unscored_and_it_exits_0(
    stack: Gateway, cli: Cli, engine: Engine
) -> None:
    ids = store_groups(stack, {"q": [1.0, 0.0]}, prefix=unique_id("junk"))
    result = rereward(
        cli, stack, "--version", "judge-v1", "--judge-base-url", engine.endpoint, "--judge-model",
        "test/served-model", "--judge-max-tokens", "8", "--rollout-ids", ",".join(ids),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "scored 0, skipped 0 (already had the version), not scored 2" in result.stdout
    assert "judge reply unusable twice: not JSON" in result.stdout
    assert result.stderr.count("judge reply unusable") == 2  # both replies logged, with their text
    assert "Traceback" not in result.stderr
    assert all(of_type(events_of(stack, rid), "reward_version") == [] for rid in ids)


def test_a_judge_endpoint_that_refuses_the_request_leaves_groups_unscored_saying_why(
    stack: Gateway, cli: Cli, engine: Engine
) -> None:
    ids = store_groups(stack, {"q": [1.0]}, prefix=unique_id("refused"))
    result = rereward(
        cli, stack, "--version", "judge-v1", "--judge-base-url", engine.endpoint, "--judge-model", "no/such-model",
        "--rollout-ids", ",".join(ids), "--progress", "false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "not scored 1" in result.stdout
    assert "judge call failed" in result.stdout and "HTTP 404" in result.stdout


def test_a_real_keraunos_serve_as_judge_leaves_the_group_unscored_and_exits_0(
    stack: Gateway, cli: Cli, tmp_path: Path
) -> None:
    from keraunos.serving.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        serve = subprocess.Popen(
            keraunos_command("serve", "--host", "127.0.0.1", "--port", str(port), "--model", str(model),
                             "--served-model-name", "tiny/judge", "--torch-threads", "1"),
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(), cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while serve.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            pytest.fail(f"keraunos serve did not start:\n{log_path.read_text(errors='replace')}")
        ids = store_groups(stack, {"q": [1.0, 0.0]}, prefix=unique_id("serve"))
        result = rereward(
            cli, stack, "--version", "judge-v1", "--judge-base-url", f"http://127.0.0.1:{port}/v1",
            "--judge-model", "tiny/judge", "--judge-max-tokens", "16", "--judge-max-chars", "200",
            "--rollout-ids", ",".join(ids), "--progress", "false",
        )  # fmt: skip
    finally:
        stop_process(serve, 10)
    assert result.returncode == 0, result.stderr
    assert "scored 0, skipped 0 (already had the version), not scored 2" in result.stdout
    assert "not scored (2): judge reply unusable twice" in result.stdout  # it answered, twice, no JSON
    assert "Traceback" not in result.stderr
    assert all(of_type(events_of(stack, rid), "reward_version") == [] for rid in ids)


# -- the command's one-line errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--callable", "m:f"), "version is required"),
        (("--version", "v1"), "give exactly one scorer"),
        (("--version", "v1", "--callable", "m:f", "--judge-base-url", "http://j/v1"), "exactly one scorer"),
        (("--version", "v1", "--judge-base-url", "http://j"), "ending in /v1"),
        (("--version", "v1", "--judge-base-url", "http://j/v1"), "needs judge_model"),
        (("--version", "v1", "--callable", "m:f", "--states", "running"), "no terminal state"),
        (("--version", "no/slash", "--callable", "m:f"), "is no id"),
    ],
)
def test_a_config_that_makes_no_run_is_a_one_line_error_with_exit_2(
    cli: Cli, args: tuple[str, ...], message: str
) -> None:
    result = cli("rereward", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_callable_or_rollout_id_is_exit_2_and_an_unreachable_gateway_exit_1(
    stack: Gateway, cli: Cli
) -> None:
    unknown_fn = rereward(cli, stack, "--version", "v1", "--callable", "no_such_module_x:f")
    assert (unknown_fn.returncode, "cannot import" in unknown_fn.stderr) == (2, True), unknown_fn.stderr
    unknown_id = rereward(
        cli, stack, "--version", "v1", "--callable", "math:floor", "--rollout-ids", "nope-1"
    )
    assert unknown_id.returncode == 2 and "no such rollout" in unknown_id.stderr, unknown_id.stderr
    down = cli(
        "rereward",
        "--gateway",
        f"http://127.0.0.1:{free_port()}",
        "--version",
        "v1",
        "--callable",
        "math:floor",
    )
    assert down.returncode == 1 and "unreachable" in down.stderr, down.stderr
    assert "Traceback" not in unknown_fn.stderr + unknown_id.stderr + down.stderr


def test_help_documents_every_field_with_its_default_and_environment_variable(cli: Cli) -> None:
    from keraunos.rereward.config import RerewardConfig

    result = cli("rereward", "--help")
    assert result.returncode == 0, result.stderr
    text, unwrapped = " ".join(result.stdout.split()), "".join(result.stdout.split())
    for name, field in RerewardConfig.model_fields.items():
        assert "--" + name.replace("_", "-") in text
        assert f"[default: {field.default!r}]" in text
        assert RerewardConfig.env_var(name) in unwrapped
    assert "rereward" in cli("--help").stdout  # listed among the commands

"""ModelProposer over a real OpenAI-compatible server on loopback: what it keeps of a small model's
replies, how it retries, how each call is recorded in a real gateway's audit log, and how a resumed
run is answered from those records without calling the model again.

The model is a cassette in replay mode (keraunos.testing.cassette) whose lines are the replies
under test, keyed by the exact requests the proposer sends; every test fails at teardown if the
proposer sent a request the cassette did not hold. Retries run against the engine stand-in's
injected faults; recording against a `keraunos gateway` process with scoped keys.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from structlog.testing import capture_logs

from keraunos.controller.client import GatewayError
from keraunos.optimize import prompts
from keraunos.optimize.proposer import (
    CALL_ACTION,
    GatewayCallLog,
    ModelProposer,
    OptimizerModel,
    ProposerError,
    audit_subject,
    read_answers,
    request_key,
)
from keraunos.optimize.types import Evaluation, Turn
from keraunos.testing.cassette import CassetteConfig, CassetteServer, start_cassette
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway, free_port, unique_id

pytestmark = pytest.mark.timeout(120)

MODEL = "optimizer/test"
TEMPLATE = "You solve arithmetic. Question: {question}\nAnswer:"
FAILURE = Evaluation(
    version=1,
    instance_id="q7",
    split="train",
    rollout_id="r-7",
    reward=0.0,
    turns=(Turn(messages=({"role": "user", "content": "Question: 2+3\nAnswer:"},), reply="six"),),
)
TRAINER_KEY = "proposer-trainer-secret-01"


class ListLog:
    """An in-memory CallLog: the entries in the order recorded."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    async def record(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)


def config(base_url: str, **fields: Any) -> OptimizerModel:
    return OptimizerModel(
        base_url=base_url, model=MODEL, temperature=0.0, max_tokens=256, backoff_s=0.01, **fields
    )


def line(
    messages: list[dict[str, str]], reply: str, *, sampling: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A cassette line answering the proposer's request for `messages` with `reply`."""
    body = {"model": MODEL, "messages": messages, **(sampling or {"temperature": 0.0, "max_tokens": 256})}
    response = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49},
    }
    return {"key": request_key(body), "request": body, "response": response}


Script = Callable[[Sequence[dict[str, Any]]], CassetteServer]


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Script]:
    """`scripted(lines)`: a replay cassette answering exactly `lines`; a miss fails the test."""
    servers: list[CassetteServer] = []

    def start(lines: Sequence[dict[str, Any]]) -> CassetteServer:
        path = tmp_path / f"cassette-{len(servers)}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(entry) + b"\n" for entry in lines))
        server = start_cassette(CassetteConfig(path=path, mode="replay", port=0))
        servers.append(server)
        return server

    yield start
    try:
        for server in servers:
            server.check_no_misses()
    finally:
        for server in servers:
            server.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def edit_once(proposer: ModelProposer, count: int = 3) -> list[str]:
    async with proposer:
        return await proposer.edit(TEMPLATE, "It never says to compute before answering.", count)


EDIT = prompts.edit_messages(TEMPLATE, "It never says to compute before answering.", 3)


# -- reading replies ---------------------------------------------------------------------------------


def test_edit_keeps_the_usable_templates_and_drops_junk_with_a_logged_reason(scripted: Script) -> None:
    good = "Compute the result step by step, then answer with the number. Question: {question}\nAnswer:"
    reply = (
        "Sure! Here are some.\n<prompt>   </prompt>\n"
        f"<prompt>{TEMPLATE}</prompt>\n"  # the original again
        "<prompt>Compute carefully. Answer:</prompt>\n"  # lost {question}
        "<prompt>Compute {question} for {user}</prompt>\n"  # added {user}
        f"<PROMPT>\n{good}\n</PROMPT>\n<prompt>{good}</prompt>"  # a repeat
    )
    server = scripted([line(EDIT, reply)])
    with capture_logs() as logs:
        kept = run(edit_once(ModelProposer(config(server.api_root))))
    assert kept == [good]
    reasons = [entry["reason"] for entry in logs if entry["event"] == "proposed template dropped"]
    assert reasons == [
        "empty template",
        "same as the original",
        "placeholders changed: lost {question}",
        "placeholders changed: added {user}",
        "a repeat",
    ]


def test_edit_returns_nothing_for_a_reply_without_tags_and_at_most_count_templates(scripted: Script) -> None:
    many = "".join(f"<prompt>Variant {n}: {{question}}</prompt>" for n in range(5))
    edit_two = prompts.edit_messages(TEMPLATE, "c", 2)
    server = scripted([line(EDIT, "I would add more detail to the prompt."), line(edit_two, many)])

    async def both() -> tuple[list[str], list[str]]:
        async with ModelProposer(config(server.api_root)) as proposer:
            none = await proposer.edit(TEMPLATE, "It never says to compute before answering.", 3)
            two = await proposer.edit(TEMPLATE, "c", 2)
            return none, two

    none, two = run(both())
    assert none == []
    assert two == ["Variant 0: {question}", "Variant 1: {question}"]


def test_reflect_and_merge_fall_back_to_the_original_on_junk_and_critique_is_the_stripped_text(
    scripted: Script,
) -> None:
    other = "Answer {question} with only a number."
    improved = "Work it out, then give only the number. Question: {question}\nAnswer:"
    server = scripted(
        [
            line(prompts.reflect_messages(TEMPLATE, [FAILURE]), "<prompt>Just answer.</prompt>"),
            line(prompts.merge_messages(TEMPLATE, other), ""),
            line(prompts.merge_messages(other, TEMPLATE), f"<prompt>{improved}</prompt>"),
            line(prompts.critique_messages(TEMPLATE, [FAILURE]), "  It asks for no computation.\n"),
        ]
    )

    async def calls() -> tuple[str, str, str, str]:
        async with ModelProposer(config(server.api_root)) as proposer:
            return (
                await proposer.reflect(TEMPLATE, [FAILURE]),
                await proposer.merge(TEMPLATE, other),
                await proposer.merge(other, TEMPLATE),
                await proposer.critique(TEMPLATE, [FAILURE]),
            )

    reflected, junk_merge, merged, critique = run(calls())
    assert reflected == TEMPLATE  # the only template lost {question}: nothing usable
    assert junk_merge == TEMPLATE
    assert merged == improved
    assert critique == "It asks for no computation."


def test_a_reply_with_no_content_is_junk_not_an_error(scripted: Script) -> None:
    entry = line(EDIT, "")
    entry["response"]["choices"][0]["message"]["content"] = None
    server = scripted([entry])
    assert run(edit_once(ModelProposer(config(server.api_root)))) == []


# -- retries -----------------------------------------------------------------------------------------


def engine_config(engine: Engine, **fields: Any) -> OptimizerModel:
    return OptimizerModel(
        base_url=engine.endpoint, model=SERVED_MODEL, max_tokens=8, backoff_s=0.01, **fields
    )


def test_a_5xx_is_retried_with_backoff_and_the_call_then_succeeds(engine: Engine) -> None:
    engine.reset()
    engine.faults(status=503, count=2)
    log = ListLog()
    run(edit_once(ModelProposer(engine_config(engine, retries=3), log=log)))
    assert engine.stats()["requests"] == 3
    assert len(log.entries) == 1  # only the answered call is recorded


def test_after_the_last_retry_the_proposer_raises_proposer_error_naming_the_model(engine: Engine) -> None:
    engine.reset()
    engine.faults(status=503, count=5)
    log = ListLog()
    with pytest.raises(ProposerError, match="no answer after 2 tries") as raised:
        run(edit_once(ModelProposer(engine_config(engine, retries=1), log=log)))
    assert raised.value.model == SERVED_MODEL and raised.value.operator == "edit"
    assert engine.stats()["requests"] == 2
    assert log.entries == []


def test_an_unreachable_model_is_retried_then_proposer_error() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ProposerError, match="ConnectError"):
        run(edit_once(ModelProposer(config(dead, retries=2))))


def test_a_4xx_is_not_retried(engine: Engine) -> None:
    engine.reset()
    unknown = OptimizerModel(base_url=engine.endpoint, model="not/served", retries=3, backoff_s=0.01)
    with pytest.raises(ProposerError, match="refused the request: HTTP 404"):
        run(edit_once(ModelProposer(unknown)))
    assert engine.stats()["requests"] == 1


def test_the_base_url_must_be_an_api_root_ending_in_v1() -> None:
    with pytest.raises(ValueError, match="/v1"):
        OptimizerModel(base_url="http://127.0.0.1:8000", model=MODEL)
    assert (
        OptimizerModel(base_url="http://127.0.0.1:8000/v1/", model=MODEL).base_url
        == "http://127.0.0.1:8000/v1"
    )


# -- recording and resume ------------------------------------------------------------------------------


def test_each_call_is_one_entry_with_its_messages_reply_usage_latency_and_model(scripted: Script) -> None:
    reply = "<prompt>Compute first. Question: {question}\nAnswer:</prompt>"
    server = scripted([line(EDIT, reply)])
    log = ListLog()
    proposer = ModelProposer(config(server.api_root), log=log)
    run(edit_once(proposer))
    [entry] = log.entries
    assert entry["operator"] == "edit" and entry["model"] == MODEL
    assert entry["messages"] == EDIT and entry["reply"] == reply
    assert entry["sampling"] == {"temperature": 0.0, "max_tokens": 256}
    assert entry["usage"] == {"prompt_tokens": 40, "completion_tokens": 9}
    assert entry["latency_ms"] >= 0
    assert entry["key"] == request_key({"model": MODEL, "messages": EDIT, **entry["sampling"]})
    assert (proposer.usage.calls, proposer.usage.prompt_tokens, proposer.usage.completion_tokens) == (
        1,
        40,
        9,
    )


def test_the_same_request_twice_in_a_run_is_asked_and_recorded_once(engine: Engine) -> None:
    engine.reset()
    log = ListLog()

    async def twice() -> list[list[str]]:
        async with ModelProposer(engine_config(engine), log=log) as proposer:
            return list(
                await asyncio.gather(*(proposer.edit(TEMPLATE, "same critique", 2) for _ in range(3)))
            )

    first, *rest = run(twice())
    assert all(other == first for other in rest)
    assert engine.stats()["requests"] == 1
    assert len(log.entries) == 1


@pytest.fixture(scope="module")
def trainer_gateway(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    digest = hashlib.sha256(TRAINER_KEY.encode()).hexdigest()
    keys = tmp_path_factory.mktemp("proposer-keys") / "keys.yaml"
    keys.write_text(
        yaml.safe_dump({"keys": [{"name": "optimizer-1", "role": "trainer", "key_sha256": digest}]})
    )
    return session_gateway_factory(args=("--keys-file", str(keys)))


def audit_items(gateway: Gateway, run_id: str) -> list[dict[str, Any]]:
    with gateway.client() as admin:
        items = admin.get("/api/audit", params={"limit": 1000}).json()["items"]
    return [item for item in items if item["subject"] == audit_subject(run_id)]


def test_calls_are_recorded_in_the_gateway_audit_log_and_a_resumed_run_is_answered_from_them(
    scripted: Script, trainer_gateway: Gateway
) -> None:
    run_id = unique_id("opt")
    reply = "<prompt>Compute first. Question: {question}\nAnswer:</prompt>"
    critique = prompts.critique_messages(TEMPLATE, [FAILURE])
    server = scripted([line(EDIT, reply), line(critique, "It asks for no computation.")])

    async def first_run() -> tuple[list[str], str]:
        async with (
            GatewayCallLog(trainer_gateway.base_url, TRAINER_KEY, run_id) as log,
            ModelProposer(config(server.api_root), log=log) as proposer,
        ):
            edited = await proposer.edit(TEMPLATE, "It never says to compute before answering.", 3)
            return edited, await proposer.critique(TEMPLATE, [FAILURE])

    edited, said = run(first_run())
    recorded = audit_items(trainer_gateway, run_id)
    assert [(e["action"], e["actor"]) for e in recorded] == [(CALL_ACTION, "key:optimizer-1")] * 2
    assert [e["evidence"]["operator"] for e in recorded] == ["edit", "critique"]
    assert recorded[0]["evidence"]["messages"] == EDIT and recorded[0]["evidence"]["reply"] == reply

    answers = run(read_answers(trainer_gateway.base_url, TRAINER_KEY, run_id))
    assert len(answers) == 2
    assert run(read_answers(trainer_gateway.base_url, TRAINER_KEY, unique_id("other"))) == {}
    # The resumed run's model is unreachable: any call it made would raise ProposerError.
    dead = config(f"http://127.0.0.1:{free_port()}/v1", retries=0)

    async def resumed() -> tuple[list[str], str, ModelProposer]:
        async with GatewayCallLog(trainer_gateway.base_url, TRAINER_KEY, run_id) as log:
            proposer = ModelProposer(dead, log=log, answers=answers)
            async with proposer:
                return (
                    await proposer.edit(TEMPLATE, "It never says to compute before answering.", 3),
                    await proposer.critique(TEMPLATE, [FAILURE]),
                    proposer,
                )

    again, said_again, proposer = run(resumed())
    assert (again, said_again) == (edited, said)
    assert (proposer.usage.calls, proposer.usage.from_record) == (0, 2)
    assert len(audit_items(trainer_gateway, run_id)) == 2


def test_a_recorded_answer_of_other_sampling_is_not_reused(
    scripted: Script, trainer_gateway: Gateway
) -> None:
    run_id = unique_id("opt")
    server = scripted([line(EDIT, "<prompt>Think: {question}</prompt>")])

    async def record() -> None:
        async with GatewayCallLog(trainer_gateway.base_url, TRAINER_KEY, run_id) as log:
            await edit_once(ModelProposer(config(server.api_root), log=log))

    run(record())
    answers = run(read_answers(trainer_gateway.base_url, TRAINER_KEY, run_id))
    hotter = OptimizerModel(
        base_url=f"http://127.0.0.1:{free_port()}/v1", model=MODEL, temperature=1.0, max_tokens=256, retries=0
    )
    with pytest.raises(ProposerError):
        run(edit_once(ModelProposer(hotter, answers=answers)))


def test_a_reader_key_cannot_record_so_the_call_fails_loudly(
    scripted: Script, gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys: [{name: looker, role: reader, key: proposer-reader-secret-01}]\n")
    gateway = gateway_factory(args=("--keys-file", str(keys)))
    server = scripted([line(EDIT, "<prompt>Think: {question}</prompt>")])

    async def attempt() -> None:
        async with GatewayCallLog(gateway.base_url, "proposer-reader-secret-01", "r") as log:
            await edit_once(ModelProposer(config(server.api_root), log=log))

    with pytest.raises(GatewayError, match="403"):
        run(attempt())

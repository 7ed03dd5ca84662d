"""One prefix chain (keraunos/prefix.py): a rollout stored, read back and merged gives the rows of its raw calls.

The fact "this call's prompt extends the previous call's prompt + response" is used three times: by
the ledger's delta storage (and its compaction of wire-form calls), by the `format=triplet&delta=1`
read, and by the trainer's merge. Whatever each does with it, a rollout that goes through all of
them must train exactly as the calls the proxy recorded: random multi-call rollouts (growing
prompts, rewritten histories, fresh prompts, a prompt sampled twice, `n > 1` calls the agent went
on with any choice of, failed calls) go into a real ledger, come back in both triplet forms, and
their rows equal the rows built from the raw calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos import prefix
from keraunos.ledger import Ledger, SqliteLedger, WireCall
from keraunos.ledger.codec._triplet_delta import delta_encode
from keraunos.protocol import RolloutCreate
from keraunos.testing.calls import growing_prefix_rollout
from keraunos.training._data import CompletedRollout, Sample, Triplet
from keraunos.training._read import read_events_json
from keraunos.training.trajectories import BuildResult, TrajectoryConfig, build_rows

MakeLedger = Callable[[], Ledger]
_ROLLOUT_IDS = (f"chain-{n}" for n in itertools.count())

# -- raw calls --------------------------------------------------------------------------------------

ids = st.lists(st.integers(0, 50_000), min_size=1, max_size=24)


@st.composite
def rollouts(draw: st.DrawFn) -> list[dict[str, Any]]:
    """`model_request` data of one rollout: each prompt continues the previous call (with the choice
    the agent went on with), rewrites its history, starts afresh or repeats it; some calls fail."""
    calls: list[dict[str, Any]] = []
    prompt = draw(st.lists(st.integers(0, 50_000), min_size=1, max_size=40))
    context: list[int] = []  # the previous successful call's prompt + the response the agent kept
    for turn in range(draw(st.integers(1, 7))):
        if turn:
            how = draw(st.sampled_from(["continue", "continue", "continue", "rewrite", "fresh", "again"]))
            if how == "continue":
                prompt = context + draw(ids)
            elif how == "rewrite":
                prompt = context[: draw(st.integers(0, max(0, len(context) - 1)))] + draw(ids)
            elif how == "fresh":
                prompt = draw(ids)
        failure = draw(st.sampled_from([None] * 6 + ["upstream", "disconnected"]))
        if failure == "upstream":  # an error body: no ids at all
            calls.append(failed_call(turn))
            continue
        n = draw(st.sampled_from([1, 1, 1, 2, 3]))
        choices = [draw(ids) for _ in range(n)]
        calls.append(call(turn, prompt, choices, draw(st.booleans())))
        if failure == "disconnected":  # recorded as failed, with the ids it had; the agent may go on
            calls[-1]["status"] = "error"
            if draw(st.booleans()):
                continue
        context = prompt + choices[draw(st.integers(0, n - 1))]
    return calls


def call(turn: int, prompt: list[int], choices: list[list[int]], chat: bool) -> dict[str, Any]:
    """A call answered with `choices`, in vLLM's chat shape (top-level prompt ids, log probs by
    content) or its completions shape (prompt ids on each choice, `token_logprobs`)."""
    out = []
    for index, token_ids in enumerate(choices):
        logprobs = [-0.125 * ((t + index) % 17) for t in token_ids]
        choice: dict[str, Any] = {"index": index, "token_ids": token_ids, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": f"answer {turn}.{index}"}
            choice["logprobs"] = {
                "content": [
                    {"token": f"t{t}", "logprob": lp, "bytes": list(f"t{t}".encode()), "top_logprobs": []}
                    for t, lp in zip(token_ids, logprobs, strict=True)
                ]
            }
        else:
            choice["text"] = f"answer {turn}.{index}"
            choice["prompt_token_ids"] = prompt
            choice["logprobs"] = {"tokens": [f"t{t}" for t in token_ids], "token_logprobs": logprobs}
        out.append(choice)
    response: dict[str, Any] = {"id": f"cmpl-{turn}", "choices": out}
    if chat:
        response["prompt_token_ids"] = prompt
    request = {"model": "m", "messages": [{"role": "user", "content": str(turn)}]} if chat else {}
    return {
        "request": request | {"model": "m", "n": len(choices)},
        "response": response,
        "server": {"model": "m", "endpoint": "http://127.0.0.1:1/v1", "version": turn % 3},
        "http_status": 200,
        "status": "ok",
    }


def failed_call(turn: int) -> dict[str, Any]:
    return {
        "request": {"model": "m", "messages": [{"role": "user", "content": str(turn)}]},
        "response": {"error": {"message": "upstream answered 500", "type": "upstream_error"}},
        "server": {"model": "m", "version": 0},
        "http_status": 500,
        "status": "error",
    }


def raw_triplets(calls: list[dict[str, Any]]) -> list[Triplet]:
    """The triplets of the raw calls, as docs/protocol.md#triplet-view defines them: of calls with
    one prompt the last kept, with the earlier ones' samples first; failed calls train nothing (a
    failed last call of its prompt stands for the latest sample of the ones it replaced)."""
    answered: list[tuple[tuple[int, ...], list[Sample] | None]] = []
    for data in calls:
        if "choices" not in data["response"]:
            continue  # no prompt ids: a failed call of its own
        response = data["response"]
        prompt = response.get("prompt_token_ids", response["choices"][0].get("prompt_token_ids"))
        if data["status"] != "ok":
            answered.append((tuple(prompt), None))
            continue
        samples = []
        for choice in response["choices"]:
            logprobs = choice["logprobs"]
            values = logprobs.get("token_logprobs") or [e["logprob"] for e in logprobs["content"]]
            samples.append(
                Sample(
                    np.array(choice["token_ids"]),
                    np.array(values, dtype=np.float32),
                    data["server"]["version"],
                )
            )
        answered.append((tuple(prompt), samples))
    last = {prompt: position for position, (prompt, _) in enumerate(answered)}
    earlier: dict[tuple[int, ...], list[Sample]] = {}
    out = []
    for position, (prompt, samples) in enumerate(answered):
        if last[prompt] != position:
            earlier.setdefault(prompt, []).extend(samples or [])
            continue
        replaced = earlier.get(prompt, [])
        if samples is None:  # failed: the latest sample it replaced stands first
            if not replaced:
                continue
            *replaced, first = replaced
            others = []
        else:
            first, *others = samples
        out.append(
            Triplet(
                np.array(prompt),
                first.response_ids,
                first.logprobs,
                first.model_version,
                (*replaced, *others),
            )
        )
    return out


# -- through the ledger -----------------------------------------------------------------------------


async def store_and_read(ledger: Ledger, rollout_id: str, calls: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    """Store `calls` (every other one as the proxy does, from its wire texts) and read the triplet
    view back as its JSON body, full and `delta=1`."""
    await ledger.create_rollouts([RolloutCreate(input={}, rollout_id=rollout_id)], 1.0)
    for k, data in enumerate(calls):
        if k % 2:
            wire = WireCall(orjson.dumps(data["request"]), orjson.dumps(data["response"]))
            await ledger.append_model_call(rollout_id, "0", data, wire, float(k))
        else:
            await ledger.append_event(rollout_id, "0", "model_request", data, float(k))
    await ledger.append_event(rollout_id, "0", "reward", {"value": 0.5}, 99.0)
    return await read_back(ledger, rollout_id)


async def read_back(ledger: Ledger, rollout_id: str) -> tuple[bytes, bytes]:
    events = await ledger.list_triplet_events(rollout_id, "0")
    dump = orjson.OPT_SERIALIZE_NUMPY
    return orjson.dumps(events, option=dump), orjson.dumps(delta_encode(events), option=dump)


def rows_of(triplets: list[Triplet], config: TrajectoryConfig) -> BuildResult:
    return build_rows([CompletedRollout("r", "g", triplets, 0.5)], config)


def assert_same_rows(a: BuildResult, b: BuildResult) -> None:
    for name in (f.name for f in fields(a.rows)):
        x, y = getattr(a.rows, name), getattr(b.rows, name)
        if isinstance(x, np.ndarray):
            assert x.shape == y.shape and np.array_equal(x, y), name
        else:
            assert x == y, name
    assert a.breaks == b.breaks
    assert a.metrics == b.metrics


def assert_flags_are_true(triplets: list[Triplet]) -> None:
    """Every `extends_previous` a reader set holds: the prompt starts with the triplet before."""
    for before, after in itertools.pairwise(triplets):
        if after.extends_previous:
            assert prefix.extends(before.prompt_ids, before.response_ids, after.prompt_ids) is not None
    assert not triplets or not triplets[0].extends_previous


configs = st.builds(
    TrajectoryConfig,
    level=st.sampled_from(["trajectory", "transition"]),
    max_prompt_len=st.sampled_from([24, 4096]),
    max_response_len=st.sampled_from([40, 4096]),
    unresolved_samples=st.sampled_from(["drop", "first_choice"]),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=rollouts(), config=configs)
def test_a_rollout_stored_read_back_and_merged_gives_the_rows_of_its_raw_calls(
    make_ledger: MakeLedger, calls: list[dict[str, Any]], config: TrajectoryConfig
) -> None:
    rollout_id = next(_ROLLOUT_IDS)

    async def through_the_ledger() -> list[tuple[bytes, bytes]]:
        async with make_ledger() as ledger:
            bodies = [await store_and_read(ledger, rollout_id, calls)]
        async with make_ledger() as ledger:  # closing compacted SQLite's wire-form calls
            bodies.append(await read_back(ledger, rollout_id))
        return bodies

    expected = rows_of(raw_triplets(calls), config)
    for full, delta in anyio.run(through_the_ledger):
        for body in (full, delta):
            read = read_events_json(body)
            assert read.reward == 0.5
            assert read.failed_calls == sum(c["status"] != "ok" for c in calls)
            assert_flags_are_true(read.triplets)
            assert_same_rows(rows_of(read.triplets, config), expected)


def test_a_growing_chain_read_in_delta_form_flags_every_call_after_the_first(tmp_path: Path) -> None:
    calls = growing_prefix_rollout(12, initial_prompt=300, response_tokens=20, observation_tokens=7)

    async def stored() -> tuple[bytes, bytes]:
        async with SqliteLedger(tmp_path / "ledger.db") as ledger:
            return await store_and_read(ledger, "r", calls)

    full, delta = anyio.run(stored)
    flagged = read_events_json(delta).triplets
    assert [t.extends_previous for t in flagged] == [False] + [True] * 11
    assert_flags_are_true(flagged)
    # The full read carries no such word (every prompt is its own list): the merge compares ids,
    # and comes to the same row.
    unflagged = read_events_json(full).triplets
    assert not any(t.extends_previous for t in unflagged)
    config = TrajectoryConfig(max_prompt_len=512, max_response_len=1024)
    assert_same_rows(rows_of(flagged, config), rows_of(unflagged, config))
    assert len(rows_of(flagged, config).rows) == 1


@pytest.mark.parametrize(
    ("prev_prompt", "prev_response", "prompt", "shared", "extends"),
    [
        ([1, 2], [3], [1, 2, 3, 4], 3, 3),
        ([1, 2], [3], [1, 2, 3], 3, 3),
        ([1, 2], [3], [1, 2], 2, None),
        ([1, 2], [3], [1, 9, 3, 4], 1, None),
        ([1, 2], None, [1, 2, 5], 2, 2),
        ([], [], [7], 0, 0),
    ],
)
def test_extends_says_where_the_new_ids_begin_and_shared_prefix_counts_what_is_common(
    prev_prompt: list[int],
    prev_response: list[int] | None,
    prompt: list[int],
    shared: int,
    extends: int | None,
) -> None:
    for as_ids in (list, lambda v: np.array(v, dtype=np.int64)):
        response = None if prev_response is None else as_ids(prev_response)
        assert prefix.shared_prefix(as_ids(prompt), as_ids(prev_prompt), response) == shared
        assert prefix.extends(as_ids(prev_prompt), response, as_ids(prompt)) == extends
        new = prefix.suffix(as_ids(prev_prompt), response, as_ids(prompt))
        assert (None if new is None else list(new)) == (None if extends is None else prompt[extends:])


def test_a_link_built_on_the_last_link_of_its_buffer_extends_it_in_place_and_others_copy() -> None:
    first = prefix.answer(prefix.start(np.array([1, 2, 3])), np.array([4, 5]))
    second = prefix.follow(first, 5, np.array([6]))
    assert second.extends_previous and second.prompt.tolist() == [1, 2, 3, 4, 5, 6]
    assert second.buffer is first.buffer
    # `first` is no longer the end of its buffer: a second continuation of it copies.
    again = prefix.follow(first, 5, np.array([7]))
    assert not again.extends_previous and again.prompt.tolist() == [1, 2, 3, 4, 5, 7]
    assert second.prompt.tolist() == [1, 2, 3, 4, 5, 6]  # views handed out never change
    shorter = prefix.follow(first, 4, np.array([8]))
    assert not shorter.extends_previous and shorter.prompt.tolist() == [1, 2, 3, 4, 8]
    with pytest.raises(ValueError, match="cannot share 6 ids"):
        prefix.follow(first, 6, np.array([9]))


def test_a_call_that_continues_a_failed_call_is_not_taken_for_a_continuation_of_the_call_before(
    tmp_path: Path,
) -> None:
    first = call(0, list(range(100, 140)), [[1, 2, 3]], True)
    failed = call(1, list(range(500, 540)), [[4, 5]], True)  # another conversation, recorded as failed
    failed["status"] = "error"
    after = call(2, [*range(500, 540), 4, 5, 6, 7], [[8, 9]], True)  # continues the failed call exactly
    calls = [first, failed, after]

    async def stored() -> tuple[bytes, bytes]:
        async with SqliteLedger(tmp_path / "ledger.db") as ledger:
            return await store_and_read(ledger, "r", calls)

    config = TrajectoryConfig(max_prompt_len=64, max_response_len=64)
    expected = rows_of(raw_triplets(calls), config)
    assert len(expected.rows) == 2 and expected.metrics["breaks"] == 1
    for body in anyio.run(stored):
        triplets = read_events_json(body).triplets
        assert [t.extends_previous for t in triplets] == [False, False]
        assert_same_rows(rows_of(triplets, config), expected)


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 50), max_size=8), st.lists(st.integers(0, 50), max_size=4)),
        max_size=6,
    )
)
def test_delta_form_is_the_same_for_stored_int32_ids_as_for_lists(
    calls: list[tuple[list[int], list[int]]],
) -> None:
    # The ledger decodes a call's ids as int32 arrays; they are compared as they are, not copied.
    def events(ids: Callable[[list[int]], Any]) -> list[dict[str, Any]]:
        return [
            {
                "event_type": "model_request",
                "data": {"prompt_token_ids": ids(p), "response_token_ids": ids(r)},
            }
            for p, r in calls
        ]

    as_int32 = delta_encode(events(lambda v: np.array(v, dtype=np.int32)))
    as_lists = delta_encode(events(list))
    dump = orjson.OPT_SERIALIZE_NUMPY
    assert orjson.dumps(as_int32, option=dump) == orjson.dumps(as_lists, option=dump)

"""What the dashboard shows of a rollout (pure, `keraunos.gateway.ui.views`): the tokens of each
call as training merges them (observation ids between calls, trained response ids with their log
probabilities), a merge break with both sides, token texts with a tokenizer, messages found beside
their calls, and a group's advantages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keraunos._settings import ConfigError
from keraunos._tokenizer_file import TokenizerFile
from keraunos.gateway.ui.views import _call_runs, attempt_view, call_messages, group_view, match_calls
from keraunos.ledger._rollout_query import RolloutRow
from keraunos.protocol import RolloutState


def triplet(prompt: list[int], response: list[int], version: int = 1) -> dict[str, Any]:
    return {
        "event_type": "model_request",
        "timestamp": 1.0,
        "data": {
            "prompt_token_ids": np.asarray(prompt),
            "response_token_ids": np.asarray(response),
            "response_log_probs": [-0.5] * len(response),
            "server": {"model": "m", "version": version},
            "status": "ok",
        },
    }


def test_a_continued_call_shows_the_ids_between_as_observation() -> None:
    events = [triplet([1, 2], [3, 4]), triplet([1, 2, 3, 4, 9, 9], [5], version=2)]
    events.append({"event_type": "reward", "timestamp": 2.0, "data": {"value": 1.0}})
    view = attempt_view("r", events)
    first, second = view.calls
    assert first["observation"]["ids"] == [1, 2] and first["response"]["mask"] == [1, 1]
    assert second["observation"]["ids"] == [9, 9] and second["response"]["ids"] == [5]
    assert second["response"]["logprobs"] == [-0.5] and second["version"] == 2
    assert (view.reward, view.breaks, view.events[0]["after_call"]) == (1.0, 0, 1)


def test_a_prompt_that_does_not_continue_is_a_break_with_both_sides() -> None:
    view = attempt_view("r", [triplet([1, 2], [3, 4]), triplet([1, 2, 7, 4, 9], [5])])
    merge_break = view.calls[1]["break"]
    assert merge_break["shared_prefix"] == 2
    assert merge_break["expected_ids"] == [1, 2, 3, 4] and merge_break["actual_ids"] == [1, 2, 7, 4, 9]
    assert view.calls[1]["observation"]["ids"] == [1, 2, 7, 4, 9]  # a new row starts: its prompt


def test_messages_are_the_ones_each_call_added_and_are_found_beside_their_calls() -> None:
    system = {"role": "system", "content": "s"}
    full = [
        {
            "event_type": "model_request",
            "data": {
                "request": {"messages": [system]},
                "response": {
                    "prompt_token_ids": [1, 2],
                    "choices": [{"message": {"role": "assistant", "content": "a"}, "token_ids": [3, 4]}],
                },
            },
        },
        {
            "event_type": "model_request",
            "data": {
                "request": {"messages": [system, {"role": "tool", "content": "<b>"}]},
                "response": {
                    "prompt_token_ids": [1, 2, 3, 4, 9],
                    "choices": [{"message": {"role": "assistant", "content": "c"}, "token_ids": [5]}],
                },
            },
        },
    ]
    messages = call_messages(full)
    assert messages[1]["messages"] == [{"role": "tool", "content": "<b>"}]
    assert messages[1]["reply"] == {"role": "assistant", "content": "c"}
    calls = attempt_view("r", [triplet([1, 2], [3, 4]), triplet([1, 2, 3, 4, 9], [5])]).calls
    assert match_calls(calls, messages) == [0, 1]


def test_a_call_is_found_by_its_place_and_a_retried_one_past_the_calls_folded_into_it() -> None:
    def entry(prompt_len: int | None, response_len: int | None) -> dict[str, Any]:
        return {"prompt_len": prompt_len, "response_len": response_len}

    def call(prompt_len: int | None, response_len: int | None, replaced: int = 0) -> dict[str, Any]:
        return {**entry(prompt_len, response_len), "replaced": replaced}

    # Nothing folded: the i-th call is the i-th full record, whatever the lengths say (a
    # completions call's full record has no top-level prompt ids).
    assert match_calls([call(4, 2), call(8, 2)], [entry(None, 2), entry(8, 2)]) == [0, 1]
    # Call 1 was tried twice with one prompt (same lengths): the second try is the one kept.
    calls = [call(4, 2), call(8, 2, replaced=1), call(12, 2)]
    assert match_calls(calls, [entry(4, 2), entry(8, 2), entry(8, 2), entry(12, 2)]) == [0, 2, 3]
    # Folded into a later call, the first try may sit anywhere before it: found by the lengths.
    calls = [call(4, 2), call(8, 2), call(4, 3, replaced=1)]
    assert match_calls(calls, [entry(4, 2), entry(8, 2), entry(4, 3), entry(4, 3)]) == [0, 1, 3]
    assert match_calls(calls, [entry(4, 2), entry(4, 3), entry(8, 2), entry(4, 3)]) == [0, 2, 3]


def test_a_group_gets_grpo_advantages_over_the_siblings_with_a_reward() -> None:
    def row(rid: str) -> RolloutRow:
        return RolloutRow(rid, RolloutState.SUCCEEDED, True, "g", "", 0.0, 0.0, 1, "1", None)

    shown = group_view([row("a"), row("b"), row("c")], [1.0, 0.0, None])
    assert shown[0]["advantage"] == pytest.approx(-shown[1]["advantage"]) and shown[0]["advantage"] > 0
    assert shown[2]["advantage"] is None


def test_with_a_tokenizer_tokens_and_breaks_carry_their_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<unk>": 0, "one": 1, "two": 2, "three": 3, "four": 4, "seven": 7, "nine": 9, "five": 5}
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(tmp_path / "tokenizer.json"))
    tokenizer = TokenizerFile(tmp_path, purpose="dashboard's tokenizer")
    view = attempt_view("r", [triplet([1, 2], [3, 4]), triplet([1, 2, 7, 4, 9], [5])], tokenizer)
    assert view.calls[0]["response"]["text"] == ["three", "four"]
    merge_break = view.calls[1]["break"]
    assert merge_break["expected_text"] is not None and "seven" in merge_break["actual_text"]


def test_a_tokenizer_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="dashboard's tokenizer"):
        TokenizerFile(tmp_path, purpose="dashboard's tokenizer")


@given(st.lists(st.integers(-1, 3), max_size=60))
def test_a_rows_calls_are_its_runs_of_equal_call_indexes(call_index: list[int]) -> None:
    # What the view shows per call: each maximal run of one call's positions (-1: no call's).
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(call_index):
        end = start + 1
        while end < len(call_index) and call_index[end] == call_index[start]:
            end += 1
        if call_index[start] >= 0:
            runs.append((start, end))
        start = end
    assert _call_runs(np.array(call_index, dtype=np.int64)) == runs

"""The scorers of keraunos rereward (keraunos/rereward/scorers.py): pure, a plain function as the judge."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from keraunos.errors import KeraunosError
from keraunos.rereward.scorers import (
    CallableScorer,
    CallText,
    JudgementError,
    JudgeScorer,
    RolloutRecord,
    Score,
    ScorerLoadError,
    judge_messages,
    load_callable,
    parse_judgement,
    render_rollout,
    transcript,
)

USER = {"role": "user", "content": "2+2?"}
A1 = {"role": "assistant", "content": "calling calc"}
TOOL = {"role": "tool", "content": "4"}
A2 = {"role": "assistant", "content": "<answer>4</answer>"}


def record(rollout_id: str = "r1", reward: float | None = 1.0, answer: str = "4") -> RolloutRecord:
    calls = [CallText([USER], A1), CallText([USER, A1, TOOL], {"role": "assistant", "content": answer})]
    return RolloutRecord(rollout_id, {"question": "2+2"}, calls, reward)


def scores_json(*values: float, explanation: str = "ok") -> str:
    entries = [
        {"trajectory_id": str(i), "explanation": explanation, "score": v} for i, v in enumerate(values, 1)
    ]
    return json.dumps({"scores": entries})


# -- the transcript ------------------------------------------------------------------------------------


def test_a_multi_turn_agent_resending_its_history_gives_each_message_once() -> None:
    calls = [CallText([USER], A1), CallText([USER, A1, TOOL], A2)]
    assert transcript(calls) == [USER, A1, TOOL, A2]


def test_calls_that_do_not_continue_each_other_are_kept_whole_one_after_the_other() -> None:
    other = {"role": "user", "content": "summarise"}
    calls = [CallText([USER], A1), CallText([other], A2)]
    assert transcript(calls) == [USER, A1, other, A2]


def test_a_long_transcript_is_cut_in_the_middle_for_the_judge_keeping_task_and_answer() -> None:
    long = RolloutRecord("r", "x", [CallText([{"role": "user", "content": "TASK " + "x" * 5000}], A2)], None)
    text = render_rollout(long, 1000)
    assert text.startswith("[user] TASK") and text.endswith("<answer>4</answer>")
    assert "characters cut" in text and len(text) < 1100


# -- parsing the judge's reply --------------------------------------------------------------------------


def test_a_judgement_reads_one_score_and_explanation_per_trajectory_in_trajectory_order() -> None:
    reply = json.dumps(
        {
            "scores": [
                {"trajectory_id": "2", "explanation": "wrong", "score": 0.1},
                {"trajectory_id": "1", "explanation": "right", "score": 0.9},
            ]
        }
    )
    assert parse_judgement(reply, 2) == [Score(0.9, "right"), Score(0.1, "wrong")]


def test_a_judgement_in_one_json_code_fence_is_read_and_integer_ids_are_accepted() -> None:
    reply = '```json\n{"scores": [{"trajectory_id": 1, "score": 1}]}\n```'
    assert parse_judgement(reply, 1) == [Score(1.0, "")]


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("Trajectory 1 is best.", "not JSON"),
        ('Here you go: {"scores": []}', "not JSON"),
        ('[{"trajectory_id": "1", "score": 0.5}]', "not an object"),
        ('{"scores": [{"trajectory_id": "1", "score": 0.5}]}', "no score for trajectory 2"),
        ('{"scores": [{"trajectory_id": "1", "score": 0.5}, {"trajectory_id": "1", "score": 0.2}]}', "twice"),
        ('{"scores": [{"trajectory_id": "3", "score": 0.5}]}', "none of 1..2"),
        (
            '{"scores": [{"trajectory_id": "1", "score": 1.5}, {"trajectory_id": "2", "score": 0}]}',
            "from 0 to 1",
        ),
        (
            '{"scores": [{"trajectory_id": "1", "score": "high"}, {"trajectory_id": "2", "score": 0}]}',
            "from 0 to 1",
        ),
        (
            '{"scores": [{"trajectory_id": "1", "score": true}, {"trajectory_id": "2", "score": 0}]}',
            "from 0 to 1",
        ),
        (
            '{"scores": [{"trajectory_id": "1", "score": NaN}, {"trajectory_id": "2", "score": 0}]}',
            "not JSON",
        ),
    ],
)
def test_a_judgement_that_is_not_exactly_the_json_asked_for_is_refused_saying_why(
    reply: str, problem: str
) -> None:
    with pytest.raises(JudgementError, match=problem):
        parse_judgement(reply, 2)


# -- the judge scorer ------------------------------------------------------------------------------------


class ScriptedChat:
    """A judge that answers from a list of replies and keeps the prompts it was sent."""

    def __init__(self, *replies: str | Exception) -> None:
        self.replies = list(replies)
        self.prompts: list[list[dict[str, Any]]] = []

    async def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.prompts.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def test_the_judge_sees_the_whole_group_in_one_prompt_with_the_rubric_and_numbered_trajectories() -> None:
    chat = ScriptedChat(scores_json(0.9, 0.2))
    group = [record("a", answer="<answer>4</answer>"), record("b", answer="<answer>5</answer>")]
    scores = asyncio.run(JudgeScorer(chat, rubric="Correct answers win.").score(group))
    assert [s.value for s in scores] == [0.9, 0.2]
    (prompt,) = chat.prompts
    assert "Correct answers win." in prompt[0]["content"]
    user = prompt[1]["content"]
    assert '<trajectory id="1">' in user and '<trajectory id="2">' in user
    assert user.index("<answer>4</answer>") < user.index("<answer>5</answer>")
    assert prompt == judge_messages(group, "Correct answers win.")


def test_an_unusable_reply_is_asked_again_once_with_the_reason_and_the_second_answer_counts() -> None:
    chat = ScriptedChat("I like the first one.", scores_json(1.0, 0.0))
    scores = asyncio.run(JudgeScorer(chat).score([record("a"), record("b")]))
    assert [s.value for s in scores] == [1.0, 0.0]
    retry = chat.prompts[1]
    assert retry[-2] == {"role": "assistant", "content": "I like the first one."}
    assert "could not be used: not JSON" in retry[-1]["content"]


def test_two_unusable_replies_leave_the_group_unscored_with_the_reason_and_no_third_call() -> None:
    chat = ScriptedChat("nope", '{"scores": []}')
    scorer = JudgeScorer(chat)
    scores = asyncio.run(scorer.score([record("a"), record("b")]))
    assert [s.value for s in scores] == [None, None]
    assert "no score for trajectory 1, 2" in scores[0].reason
    assert scorer.calls == 2


def test_a_judge_that_cannot_answer_leaves_the_group_unscored_instead_of_raising() -> None:
    chat = ScriptedChat(KeraunosError("HTTP 404: no such model"))
    scores = asyncio.run(JudgeScorer(chat).score([record("a")]))
    assert scores == [Score(None, "judge call failed: HTTP 404: no such model")]


# -- the callable scorer -------------------------------------------------------------------------------


def test_a_callable_is_called_per_rollout_with_input_transcript_and_old_reward() -> None:
    seen = []

    def fn(input: Any, messages: list[dict[str, Any]], old_reward: float | None) -> float:
        seen.append((input, len(messages), old_reward))
        return 0.25 if old_reward is None else 1 - old_reward

    scores = asyncio.run(CallableScorer(fn).score([record("a", 1.0), record("b", None)]))
    assert [s.value for s in scores] == [0.0, 0.25]
    assert seen == [({"question": "2+2"}, 4, 1.0), ({"question": "2+2"}, 4, None)]


def test_an_async_callable_is_awaited() -> None:
    async def fn(input: Any, messages: Any, old_reward: Any) -> float:
        return 0.5

    assert asyncio.run(CallableScorer(fn).score([record()])) == [Score(0.5)]


def test_a_callable_that_raises_or_answers_no_finite_number_leaves_only_that_rollout_unscored() -> None:
    answers = iter([ZeroDivisionError("boom"), "high", math.inf, 1])

    def fn(input: Any, messages: Any, old_reward: Any) -> Any:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    scores = asyncio.run(CallableScorer(fn, name="m:f").score([record(str(i)) for i in range(4)]))
    assert [s.value for s in scores] == [None, None, None, 1.0]
    assert scores[0].reason == "m:f raised ZeroDivisionError('boom')"
    assert "not a finite number" in scores[1].reason


def test_load_callable_follows_module_colon_attribute_and_names_what_is_wrong() -> None:
    assert load_callable("math:floor") is math.floor
    assert load_callable("os:path.join") is __import__("os").path.join
    for target, problem in [
        ("math.floor", "form module:function"),
        ("no_such_module_x:f", "cannot import"),
        ("math:nothing", "has no 'nothing'"),
        ("math:pi", "not a function"),
    ]:
        with pytest.raises(ScorerLoadError, match=problem):
            load_callable(target)

"""The calc agent's text protocol, its calculator and its conversation loop (pure, no I/O)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keraunos.examples.calc.agent import TaskError, read_task
from keraunos.examples.calc.conversation import REMINDER, Episode, reward_of, solve
from keraunos.examples.calc.dataset import generate
from keraunos.examples.calc.protocol import (
    CalcCall,
    CalcError,
    FinalAnswer,
    evaluate,
    format_number,
    is_correct,
    parse_number,
    parse_reply,
    tool_result,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*7", 84),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("-5 - -3", -2),
        ("+7", 7),
        ("84 / 12", 7),
        ("7 / 2", Fraction(7, 2)),
        ("1 - 10 / 4 * 2", -4),
    ],
)
def test_calculator_evaluates_integer_arithmetic_exactly(expression: str, value: Fraction | int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "only integers"),
        ("x + 1", "only integers"),
        ("2 ** 10", "only integers"),
        ("1.5 + 1", "only integers"),
        ("True + 1", "only integers"),
        ("[1, 2]", "only integers"),
        ("1 / 0", "division by zero"),
        ("1 / (2 - 2)", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 31, "30 digits"),
        ("9" * 30 + ("*" + "9" * 30) * 6, "longer than 200"),
    ],
)
def test_calculator_refuses_anything_else_with_a_short_reason(expression: str, why: str) -> None:
    with pytest.raises(CalcError, match=why):
        evaluate(expression)


derandomised = settings(derandomize=True, database=None, deadline=None)


@derandomised
@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.sampled_from("+-*"))
def test_calculator_agrees_with_python_on_integer_operations(a: int, b: int, op: str) -> None:
    expected = {"+": a + b, "-": a - b, "*": a * b}[op]
    assert evaluate(f"{a} {op} ({b})") == expected


@derandomised
@given(st.fractions(min_value=-(10**12), max_value=10**12, max_denominator=10**6))
def test_formatted_results_read_back_as_the_same_number(value: Fraction) -> None:
    text = format_number(value)
    assert parse_number(text) == value
    assert evaluate(text) == value


def test_the_tool_result_is_the_value_or_the_error_in_result_tags() -> None:
    assert tool_result("12*7") == "<result>84</result>"
    assert tool_result("7/2") == "<result>7/2</result>"
    assert tool_result("1/0") == "<result>error: division by zero</result>"


def test_a_reply_is_an_answer_a_calculator_call_or_nothing() -> None:
    assert parse_reply("I need <calc> 12 * 7 </calc> first") == CalcCall("12 * 7")
    assert parse_reply("<answer> 84 </answer>") == FinalAnswer("84")
    assert parse_reply("<calc>1+1</calc> so <answer>2</answer>") == FinalAnswer("2")
    assert parse_reply("<calc>1</calc><calc>2</calc>") == CalcCall("1")
    assert parse_reply("the answer is 84") is None
    assert parse_reply("<calc>unclosed") is None


@pytest.mark.parametrize(
    ("text", "expected", "correct"),
    [
        ("84", 84, True),
        (" 84.0 ", 84, True),
        ("168/2", "84", True),
        ("-3", -3, True),
        ("83", 84, False),
        ("84 apples", 84, False),
        ("1,000", 1000, False),
        ("", 0, False),
        ("1/0", 0, False),
    ],
)
def test_an_answer_is_correct_only_when_it_is_exactly_the_number(
    text: str, expected: int | str, correct: bool
) -> None:
    assert is_correct(text, expected) is correct


def scripted(*replies: str):
    """A model that answers with `replies` in order and remembers what it was shown."""
    seen: list[list[dict[str, str]]] = []

    def chat(messages: list[dict[str, str]]) -> str:
        seen.append([dict(m) for m in messages])
        return replies[len(seen) - 1]

    return chat, seen


def test_a_calculator_call_is_answered_in_the_next_user_turn_and_the_answer_ends_the_episode() -> None:
    chat, seen = scripted("Let me compute. <calc>12*7</calc>", "<answer>84</answer>", "never asked")
    episode = solve("What is 12 * 7?", chat, max_turns=4)
    assert episode.model_calls == 2 and episode.tool_calls == 1
    assert episode.answer == "84" and reward_of(episode, 84) == 1.0
    # The second call sees the first reply verbatim, then the tool's result as a user turn.
    assert seen[1][2:] == [
        {"role": "assistant", "content": "Let me compute. <calc>12*7</calc>"},
        {"role": "user", "content": "<result>84</result>"},
    ]
    # Every prompt extends the previous prompt and reply (what lets a trainer merge the turns).
    assert seen[1][: len(seen[0])] == seen[0]


def test_a_reply_without_tags_gets_the_reminder_and_turns_are_bounded() -> None:
    chat, seen = scripted("hmm", "still thinking", "84?")
    episode = solve("What is 12 * 7?", chat, max_turns=3)
    assert episode.model_calls == 3 and episode.answer is None
    assert reward_of(episode, 84) == 0.0
    assert seen[1][-1] == {"role": "user", "content": REMINDER}


def test_a_wrong_answer_gets_no_reward() -> None:
    assert reward_of(Episode([], answer="85"), 84) == 0.0
    assert reward_of(Episode([], answer=None), 84) == 0.0


def test_the_task_comes_from_the_rollout_input_in_agent_input() -> None:
    assert read_task({"AGENT_INPUT": json.dumps({"question": "What is 1+1?", "answer": 2})}) == (
        "What is 1+1?",
        2,
    )
    with pytest.raises(TaskError, match="AGENT_INPUT is not set"):
        read_task({})
    with pytest.raises(TaskError, match="question"):
        read_task({"AGENT_INPUT": json.dumps({"answer": 2})})
    with pytest.raises(TaskError, match="not JSON"):
        read_task({"AGENT_INPUT": "{"})


def test_the_dataset_is_seeded_and_every_answer_is_its_question_computed() -> None:
    rows = list(generate(200, seed=3, max_operands=3))
    assert rows == list(generate(200, seed=3, max_operands=3))
    assert rows != list(generate(200, seed=4, max_operands=3))
    assert len({row["id"] for row in rows}) == 200
    for row in rows:
        expression = row["question"].removeprefix("What is ").removesuffix("?")
        assert evaluate(expression) == row["answer"]
        assert isinstance(row["answer"], int)


def test_the_example_train_config_is_a_valid_keraunos_train_config() -> None:
    from pathlib import Path

    from keraunos.training.train_config import TrainConfig

    config = TrainConfig.load(None, Path(__file__).resolve().parents[2] / "examples" / "calc" / "train.yaml")
    assert (
        config.agent_class == "keraunos.examples.calc.agent:CalcAgent" and config.input_env == "AGENT_INPUT"
    )

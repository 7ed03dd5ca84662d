"""What the optimizer model is shown and how its replies are read (keraunos.optimize.prompts): bounded
material, long conversations cut in the middle, and a reader that never raises on junk."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keraunos.optimize import prompts
from keraunos.optimize.types import Evaluation, Turn

TEMPLATE = "Solve: {question}. Use {{braces}} literally."


def evaluation(n: int, reward: float, *, failed: bool = False, turns: tuple[Turn, ...] = ()) -> Evaluation:
    return Evaluation(
        version=1,
        instance_id=f"q{n}",
        split="train",
        rollout_id=f"r{n}",
        reward=reward,
        failed=failed,
        turns=turns,
    )


def test_a_critique_shows_the_template_and_at_most_the_first_four_failures_with_their_rewards() -> None:
    failures = [evaluation(n, 0.1 * n) for n in range(7)]
    [system, user] = prompts.critique_messages(TEMPLATE, failures)
    assert system["role"] == "system" and "Do not rewrite" in system["content"]
    text = user["content"]
    assert f"<prompt>\n{TEMPLATE}\n</prompt>" in text
    assert "4 of 7 rollouts" in text
    assert "task q3" in text and "task q4" not in text
    assert "reward 0.2" in text


def test_a_long_conversation_is_cut_in_the_middle_keeping_its_start_and_its_end() -> None:
    question = "Q" * 5000
    turn = Turn(
        messages=({"role": "user", "content": "START " + question + " END"},), reply="the-final-reply"
    )
    [_, user] = prompts.critique_messages(TEMPLATE, [evaluation(1, 0.0, turns=(turn,))])
    text = user["content"]
    assert "user: START" in text and "assistant: the-final-reply" in text
    assert "characters cut" in text
    assert len(text) < prompts.MAX_CONVERSATION_CHARS + 1500


def test_a_growing_chat_is_written_once_not_once_per_call() -> None:
    system = {"role": "system", "content": "You are a calculator."}
    first = Turn(messages=(system, {"role": "user", "content": "2+3?"}), reply="CALL add(2,3)")
    second = Turn(
        messages=(
            system,
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "CALL add(2,3)"},
            {"role": "user", "content": "result: 5"},
        ),
        reply="5",
    )
    text = prompts.conversation_text([first, second])
    assert text.splitlines() == [
        "system: You are a calculator.",
        "user: 2+3?",
        "assistant: CALL add(2,3)",
        "user: result: 5",
        "assistant: 5",
    ]


def test_content_parts_are_joined_as_text() -> None:
    turn = Turn(
        messages=(
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ),
        reply="",
    )
    assert prompts.conversation_text([turn]).splitlines()[0] == "user: ab"


def test_a_reflection_shows_the_worst_failed_first_and_the_best_apart() -> None:
    evaluations = [evaluation(n, reward) for n, reward in enumerate([0.9, 0.1, 0.5, 1.0, 0.2, 0.0, 0.8])]
    evaluations.append(evaluation(9, 0.95, failed=True))
    worst, best = prompts.split_by_reward(evaluations)
    assert [e.instance_id for e in worst] == ["q9", "q5", "q1", "q4"]
    assert [e.instance_id for e in best] == ["q3", "q0"]
    [_, user] = prompts.reflect_messages(TEMPLATE, evaluations)
    assert (
        user["content"].index("went worst")
        < user["content"].index("task q9")
        < user["content"].index("went best")
    )


def test_a_reflection_over_few_evaluations_shows_no_best_section() -> None:
    worst, best = prompts.split_by_reward([evaluation(1, 0.0), evaluation(2, 1.0)])
    assert [e.instance_id for e in worst] == ["q1", "q2"] and best == []
    assert "went best" not in prompts.reflect_messages(TEMPLATE, [evaluation(1, 0.0)])[1]["content"]


def test_placeholders_are_the_format_fields_by_root_name_and_none_for_a_lone_brace() -> None:
    assert prompts.placeholders(TEMPLATE) == {"question"}
    assert prompts.placeholders("{row.x} and {row[0]} and {n!r:>3}") == {"row", "n"}
    assert prompts.placeholders("no fields {{here}}") == frozenset()
    assert prompts.placeholders("a lone { brace") is None


def test_a_candidate_that_breaks_the_format_string_is_dropped_saying_so() -> None:
    kept, drops = prompts.candidates("<prompt>Solve: {question} {</prompt>", TEMPLATE)
    assert kept == [] and drops[0].reason.startswith("not a valid str.format template")


def test_escaped_braces_are_kept_and_the_original_order_of_candidates_too() -> None:
    reply = "<prompt>B {question} {{x}}</prompt> text <prompt>A {question}</prompt>"
    assert prompts.candidates(reply, TEMPLATE)[0] == ["B {question} {{x}}", "A {question}"]


@given(st.text(max_size=300), st.sampled_from([TEMPLATE, "plain", "{a} {b}", "lone {"]))
def test_reading_any_reply_never_raises_and_keeps_only_templates_with_the_original_fields(
    reply: str, original: str
) -> None:
    wrapped = f"{reply}<prompt>{reply}</prompt>"
    kept, _ = prompts.candidates(wrapped, original)
    wanted = prompts.placeholders(original)
    for template in kept:
        assert template.strip() and template != original.strip()
        if wanted is not None:
            assert prompts.placeholders(template) == wanted

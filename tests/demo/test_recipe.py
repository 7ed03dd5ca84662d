"""The demo's warm-start data and its tokenisation: exactly the calc agent's protocol, two calls per
conversation, the loss on the assistant's turns only (pure functions, one tokenizer built here)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from keraunos.demo.prepare import CACHE_ENV, build_tag, cache_root, entry_dir
from keraunos.demo.recipe import (
    Recipe,
    render,
    tokenizer_corpus,
    warm_start_conversations,
    warm_start_replies,
    wrong_guess,
)
from keraunos.demo.sft import IGNORE, collate, learning_rate, tokenize_conversation
from keraunos.examples.calc.conversation import REMINDER, SYSTEM_PROMPT
from keraunos.examples.calc.protocol import (
    CalcCall,
    FinalAnswer,
    evaluate,
    is_correct,
    parse_reply,
    tool_result,
)

SMALL = Recipe(examples=200, tool_share=0.4)


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, str]]]:
    return warm_start_conversations(SMALL)


@pytest.fixture(scope="module")
def tokenizer(conversations: list[list[dict[str, str]]]):
    from keraunos.serving.tiny import build_tokenizer

    return build_tokenizer(tokenizer_corpus(conversations), SMALL.vocab_size, split_digits=True)


def test_every_warm_start_conversation_is_what_the_calc_agent_exchanges_in_two_model_calls(
    conversations: list[list[dict[str, str]]],
) -> None:
    for messages in conversations:
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user", "assistant"]
        assert isinstance(parse_reply(messages[-1]["content"]), FinalAnswer)


def test_calculator_conversations_copy_the_question_and_answer_right_the_others_answer_wrong(
    conversations: list[list[dict[str, str]]],
) -> None:
    used_tool = 0
    for messages in conversations:
        expression = messages[1]["content"].removeprefix("What is ").removesuffix("?")
        first = parse_reply(messages[2]["content"])
        final = parse_reply(messages[4]["content"])
        assert isinstance(final, FinalAnswer)
        right = is_correct(final.text, str(evaluate(expression)))
        if isinstance(first, CalcCall):
            used_tool += 1
            assert first.expression == expression
            assert messages[3]["content"] == tool_result(expression)
            assert right
        else:
            assert first is None and messages[3]["content"] == REMINDER
            assert not right
            # The guess in words is the number it then answers.
            assert messages[2]["content"] == f"I think it is {final.text}."
    assert 0.3 < used_tool / len(conversations) < 0.5  # tool_share 0.4


def test_a_wrong_guess_is_never_the_answer_and_has_about_its_size() -> None:
    rng = random.Random(0)
    for answer in [0, 1, 7, 84, 81, -8]:
        guesses = [wrong_guess(answer, rng) for _ in range(200)]
        assert answer not in guesses
        assert max(abs(g) for g in guesses) <= max(9, 2 * abs(answer))


def test_the_replies_of_both_habits() -> None:
    rng = random.Random(1)
    assert warm_start_replies("12 * 7", 84, use_tool=True, rng=rng) == [
        "<calc>12 * 7</calc>",
        "<answer>84</answer>",
    ]
    first, second = warm_start_replies("12 * 7", 84, use_tool=False, rng=rng)
    assert first.startswith("I think it is ") and second.startswith("<answer>")


def test_the_same_recipe_gives_the_same_data_and_hash_and_another_recipe_another_hash() -> None:
    assert warm_start_conversations(Recipe(examples=20)) == warm_start_conversations(Recipe(examples=20))
    assert Recipe(examples=20).digest() == Recipe(examples=20).digest()
    assert Recipe(examples=20).digest() != Recipe(examples=20, seed=1).digest()
    assert Recipe(examples=20).digest() != Recipe(examples=20, sft_steps=1).digest()


def test_the_tokenizer_has_at_least_512_entries_and_digits_of_their_own(tokenizer) -> None:
    assert len(tokenizer) >= 512
    assert tokenizer.tokenize("<answer>9801</answer>")[3:7] == ["9", "8", "0", "1"]


def test_tokenised_conversations_are_the_chat_template_and_train_only_the_assistant_turns(
    conversations: list[list[dict[str, str]]], tokenizer
) -> None:
    for messages in conversations[:20]:
        example = tokenize_conversation(tokenizer, messages)
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        assert rendered == render(messages)
        assert example.ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
        trained = tokenizer.decode([i for i, t in zip(example.ids, example.trained, strict=True) if t])
        assert trained == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")


def test_collate_pads_on_the_right_and_labels_the_next_trained_id() -> None:
    from keraunos.demo.sft import Example

    short = Example([5, 6, 7], [False, True, True])
    long = Example([1, 2, 3, 4], [False, False, True, False])
    inputs, masks, labels = collate([short, long], pad_id=0)
    assert inputs == [[5, 6, 7, 0], [1, 2, 3, 4]]
    assert masks == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert labels == [[6, 7, IGNORE, IGNORE], [IGNORE, 3, IGNORE, IGNORE]]


def test_the_warm_start_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    rates = [learning_rate(step, 100, 1e-3, 10) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(rates[9:]))
    assert learning_rate(100, 100, 1e-3, 10) == pytest.approx(1e-4)


def test_the_cache_is_the_flag_else_the_environment_else_the_home_cache(tmp_path: Path) -> None:
    assert cache_root(str(tmp_path / "flag"), {CACHE_ENV: "/env"}) == tmp_path / "flag"
    assert cache_root("", {CACHE_ENV: str(tmp_path / "env")}) == tmp_path / "env"
    assert cache_root("", {}) == Path.home() / ".cache" / "keraunos"
    assert (
        entry_dir(tmp_path, SMALL, "t2-avx2-torch2.13.0")
        == tmp_path / "demo" / f"{SMALL.digest()}-t2-avx2-torch2.13.0"
    )


def test_the_build_tag_names_the_thread_count_the_cpu_and_torch_in_a_path_safe_name() -> None:
    import torch

    tag = build_tag(3)
    assert tag.startswith("t3-") and f"torch{torch.__version__}".replace("+", "_") in tag
    assert "/" not in tag and "+" not in tag
    assert build_tag(0) == build_tag(torch.get_num_threads())

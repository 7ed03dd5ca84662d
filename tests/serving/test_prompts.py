"""Token-in, token-out: replies the server generated come back in later prompts as the ids it sampled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keraunos.serving.detokenize import TextTracker
from keraunos.serving.prompts import PromptError, TokenCache, chat_prompt_ids, completion_prompt_ids, encode


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def char_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` as one token per character: a valid tokenisation that BPE would never produce."""
    return [i for ch in text for i in encode(tokenizer, ch)]


def test_the_cache_is_bounded_and_the_latest_ids_of_a_text_win() -> None:
    cache = TokenCache(2)
    cache.remember("a", [1])
    cache.remember("b", [2])
    cache.remember("a", [3])
    cache.remember("c", [4])
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == ((3,), None, (4,), 2)
    cache.remember("", [5])
    assert cache.get("") is None


def test_a_remembered_reply_is_spliced_in_as_sampled_where_retokenising_would_merge(tokenizer: Any) -> None:
    reply = "The answer is 42."
    sampled = [*char_ids(tokenizer, reply), tokenizer.eos_token_id]
    assert encode(tokenizer, reply) != sampled[:-1]  # BPE merges these characters
    cache = TokenCache(8)
    cache.remember(reply, sampled)
    first = [{"role": "user", "content": "What is 6 * 7?"}]
    first_ids = chat_prompt_ids(tokenizer, first, cache)
    then = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    ids = chat_prompt_ids(tokenizer, then, cache)
    assert ids[: len(first_ids) + len(sampled)] == first_ids + sampled
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(
        then, tokenize=False, add_generation_prompt=True
    )
    assert chat_prompt_ids(tokenizer, then, TokenCache(8)) != ids  # without the cache: re-tokenised


def test_the_same_reply_text_sampled_differently_in_two_conversations_keeps_each_ones_ids(
    tokenizer: Any,
) -> None:
    # A converged policy writes the same reply in many rollouts of a group, sampled as different
    # token sequences: each conversation's next prompt must continue with its own ids.
    reply = "The answer is 12."
    as_chars = [*char_ids(tokenizer, reply), tokenizer.eos_token_id]
    as_bpe = [*encode(tokenizer, reply), tokenizer.eos_token_id]
    assert as_chars != as_bpe
    cache = TokenCache(8)
    cache.remember(reply, as_chars, "r1/1")
    cache.remember(reply, as_bpe, "r2/1")  # the most recent, but another conversation's
    question = [{"role": "user", "content": "What is 3 * 4?"}]
    then = [*question, {"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    for session, sampled in (("r1/1", as_chars), ("r2/1", as_bpe)):
        first_ids = chat_prompt_ids(tokenizer, question, cache, session=session)
        ids = chat_prompt_ids(tokenizer, then, cache, session=session)
        assert ids[: len(first_ids) + len(sampled)] == first_ids + sampled
    # A conversation that never saw the reply gets it re-tokenised, not another one's ids.
    assert cache.get(reply, "r3/1") is None and cache.get(reply) is None


def test_a_reply_cut_before_its_end_token_gets_the_templates_end_token(tokenizer: Any) -> None:
    reply = "The ans"
    sampled = char_ids(tokenizer, reply)
    cache = TokenCache(8)
    cache.remember(reply, sampled)
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "go on"},
    ]
    ids = chat_prompt_ids(tokenizer, messages, cache)
    prefix = chat_prompt_ids(tokenizer, messages[:1], cache)
    assert ids[: len(prefix) + len(sampled) + 1] == [*prefix, *sampled, tokenizer.eos_token_id]


def test_unknown_assistant_text_and_other_roles_are_tokenised_as_rendered(tokenizer: Any) -> None:
    cache = TokenCache(8)
    cache.remember("42", char_ids(tokenizer, "42"))
    messages = [{"role": "user", "content": "42"}, {"role": "assistant", "content": "43"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat_prompt_ids(tokenizer, messages, cache) == encode(tokenizer, rendered)


@pytest.mark.parametrize("messages", [[], "hi", [{"content": "no role"}]])
def test_malformed_messages_are_refused(tokenizer: Any, messages: Any) -> None:
    with pytest.raises(PromptError):
        chat_prompt_ids(tokenizer, messages, TokenCache(1))


def test_completion_prompts_are_text_or_ids_within_the_vocabulary(tokenizer: Any) -> None:
    assert completion_prompt_ids(tokenizer, [[1, 2], [3]], 512) == [[1, 2], [3]]
    assert completion_prompt_ids(tokenizer, "What is", 512) == [encode(tokenizer, "What is")]
    with pytest.raises(PromptError, match="token id 512 is out of vocabulary"):
        completion_prompt_ids(tokenizer, [1, 512], 512)


def test_stop_strings_end_the_text_before_them_and_are_held_back_from_streams(tokenizer: Any) -> None:
    ids = encode(tokenizer, "The answer is 42. Done")
    tracker = TextTracker(tokenizer, stop=("is 4", "Done"))
    streamed = ""
    stopped = None
    for n in range(1, len(ids) + 1):
        stopped = tracker.update(ids[:n])
        streamed += tracker.delta(final=stopped is not None)
        if stopped:
            break
    assert (stopped, tracker.text, streamed) == ("is 4", "The answer ", "The answer ")

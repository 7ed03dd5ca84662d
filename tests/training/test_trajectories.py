"""Rollouts to rows: exact merging, masks, limits and merge-break diagnostics (keraunos.training.trajectories)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.training._data import CompletedRollout, Sample, Triplet
from keraunos.training.trajectories import MergeBreak, TrajectoryConfig, build_rows, trajectories

PROPERTY = settings(
    derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ROOMY = TrajectoryConfig(max_prompt_len=256, max_response_len=256)  # above any generated length


def triplet(prompt: list[int], response: list[int], logprobs: list[float] | None = None) -> Triplet:
    lp = np.array(logprobs, dtype=np.float32) if logprobs is not None else None
    return Triplet(np.array(prompt, dtype=np.int64), np.array(response, dtype=np.int64), lp, 1)


def rollout(calls: list[Triplet], rid: str = "r0", reward: float = 1.0) -> CompletedRollout:
    return CompletedRollout(rollout_id=rid, group_id="g0", triplets=calls, reward=reward)


@st.composite
def rollouts(draw: st.DrawFn) -> list[Triplet]:
    """A random multi-turn rollout: prompts that grow, break (drift, rewrite) or restart; small ids
    so that accidental continuations happen too."""
    ids = st.integers(0, 6)
    calls: list[Triplet] = []
    prompt = draw(st.lists(ids, min_size=1, max_size=10))
    for _ in range(draw(st.integers(1, 6))):
        response = draw(st.lists(ids, max_size=8))
        logprobs = draw(
            st.one_of(
                st.none(),
                st.just([-0.5 - i for i in range(len(response))]),
                st.just([-0.5] * max(0, len(response) - 1)),  # one short: not complete
            )
        )
        calls.append(triplet(prompt, response, logprobs))
        history = prompt + response
        move = draw(st.sampled_from(["grow", "grow", "grow", "drift", "rewrite", "restart"]))
        gap = draw(st.lists(ids, max_size=5))
        if move == "grow":
            prompt = history + gap
        elif move == "drift" and history:
            at = draw(st.integers(0, len(history) - 1))
            prompt = [*history[:at], history[at] + 7, *history[at + 1 :], *gap]
        elif move == "rewrite":
            prompt = history[: draw(st.integers(0, len(history)))] + gap + [9]
        else:
            prompt = draw(st.lists(ids, min_size=1, max_size=10))
    return calls


def as_list(array: np.ndarray) -> list[int]:
    return [int(x) for x in array]


def row_content(rows: Any, i: int) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response mask) of row i with the padding taken off."""
    p = rows.prompt_len
    attention = rows.attention_mask[i]
    prompt = as_list(rows.input_ids[i, :p][attention[:p] == 1])
    n_response = int(attention[p:].sum())
    return prompt, as_list(rows.input_ids[i, p : p + n_response]), as_list(rows.response_mask[i, :n_response])


def continues(prompt: list[int], previous: Triplet) -> bool:
    full = as_list(previous.prompt_ids) + as_list(previous.response_ids)
    return prompt[: len(full)] == full


def expected_rows(calls: list[Triplet]) -> list[list[int]]:
    """Call indices of each trajectory row, computed the slow and obvious way."""
    groups: list[list[int]] = []
    for k, call in enumerate(calls):
        if groups and continues(as_list(call.prompt_ids), calls[k - 1]):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


@PROPERTY
@given(calls=rollouts())
def test_merged_rows_reproduce_every_call_in_order_with_masks_exactly_on_generated_tokens(
    calls: list[Triplet],
) -> None:
    result = build_rows([rollout(calls)], ROOMY)
    rows = result.rows
    groups = [g for g in expected_rows(calls) if sum(len(calls[k].response_ids) for k in g) > 0]
    assert [as_list(rows.first_call), as_list(rows.n_calls)] == [
        [g[0] for g in groups],
        [len(g) for g in groups],
    ]
    for i, group in enumerate(groups):
        prompt, response, mask = row_content(rows, i)
        assert prompt == as_list(calls[group[0]].prompt_ids)
        full = prompt + response
        expected_mask = [0] * len(response)
        for k in group:
            call_prompt, call_response = as_list(calls[k].prompt_ids), as_list(calls[k].response_ids)
            assert full[: len(call_prompt) + len(call_response)] == call_prompt + call_response
            start = len(call_prompt) - len(prompt)
            expected_mask[start : start + len(call_response)] = [1] * len(call_response)
        last = calls[group[-1]]
        assert len(full) == len(last.prompt_ids) + len(last.response_ids)  # nothing after the last call
        assert mask == expected_mask


@PROPERTY
@given(calls=rollouts())
def test_nothing_is_lost_or_duplicated_within_the_limits(calls: list[Triplet]) -> None:
    rows = build_rows([rollout(calls)], ROOMY).rows
    covered = [
        k for i in range(len(rows)) for k in range(rows.first_call[i], rows.first_call[i] + rows.n_calls[i])
    ]
    trainable_calls = [k for k, c in enumerate(calls) if len(c.response_ids)]
    assert set(trainable_calls) <= set(covered)
    assert len(covered) == len(set(covered))
    assert int(rows.response_mask.sum()) == sum(len(c.response_ids) for c in calls)


@PROPERTY
@given(calls=rollouts())
def test_transition_and_trajectory_levels_train_the_same_tokens_without_truncation(
    calls: list[Triplet],
) -> None:
    merged = build_rows([rollout(calls)], ROOMY).rows
    single = build_rows([rollout(calls)], ROOMY.model_copy(update={"level": "transition"})).rows
    assert int(merged.response_mask.sum()) == int(single.response_mask.sum())
    assert len(single) == sum(1 for c in calls if len(c.response_ids))
    trained = merged.old_logprobs[merged.response_mask == 1]
    if merged.logprobs_valid.all() and single.logprobs_valid.all():
        assert sorted(trained.tolist()) == sorted(single.old_logprobs[single.response_mask == 1].tolist())


@PROPERTY
@given(calls=rollouts(), max_prompt=st.integers(1, 12), max_response=st.integers(1, 12))
def test_limits_drop_long_prompts_cut_long_responses_and_count_both(
    calls: list[Triplet], max_prompt: int, max_response: int
) -> None:
    config = TrajectoryConfig(max_prompt_len=max_prompt, max_response_len=max_response)
    roomy = build_rows([rollout(calls)], ROOMY).rows
    result = build_rows([rollout(calls)], config)
    rows = result.rows
    assert rows.input_ids.shape == (len(rows), max_prompt + max_response)
    dropped = cut = 0
    kept = iter(range(len(rows)))
    for i in range(len(roomy)):
        prompt, response, mask = row_content(roomy, i)
        if len(prompt) > max_prompt:
            dropped += 1
            continue
        if len(response) > max_response:
            cut += 1
        if sum(mask[:max_response]) == 0:
            continue
        j = next(kept)
        assert row_content(rows, j) == (prompt, response[:max_response], mask[:max_response])
        # Left-padded prompt, right-padded response; positions count real tokens only.
        attention = rows.attention_mask[j]
        assert as_list(rows.position_ids[j][attention == 1]) == list(range(int(attention.sum())))
        assert rows.token_rewards[j].nonzero()[0].tolist() == [min(len(response), max_response) - 1]
    assert next(kept, None) is None
    assert result.metrics["prompt_too_long_rows"] == dropped
    assert result.metrics["truncated_rows"] == cut


@PROPERTY
@given(calls=rollouts())
def test_old_logprobs_are_kept_only_when_every_call_of_the_row_has_them_complete(
    calls: list[Triplet],
) -> None:
    rows = build_rows([rollout(calls)], ROOMY).rows
    for i in range(len(rows)):
        members = [calls[k] for k in range(rows.first_call[i], rows.first_call[i] + rows.n_calls[i])]
        complete = all(c.logprobs is not None and len(c.logprobs) == len(c.response_ids) for c in members)
        assert bool(rows.logprobs_valid[i]) == complete
        if complete:
            expected = [float(x) for c in members for x in c.logprobs]  # type: ignore[union-attr]
            assert rows.old_logprobs[i][rows.response_mask[i] == 1].tolist() == expected
        assert not rows.old_logprobs[i][rows.response_mask[i] == 0].any()


def test_rows_carry_rollout_and_group_ids_and_the_reward_of_their_rollout() -> None:
    a = rollout([triplet([1, 2], [3]), triplet([9], [4, 5])], rid="a", reward=0.25)
    b = CompletedRollout(rollout_id="b", group_id="g1", triplets=[triplet([1], [2])], reward=-1.0)
    rows = build_rows([a, b], ROOMY).rows
    assert rows.rollout_ids.tolist() == ["a", "a", "b"]
    assert rows.data_ids.tolist() == ["g0", "g0", "g1"]
    assert rows.rollout_index.tolist() == [0, 0, 1]
    assert rows.rewards.tolist() == [0.25, 0.25, -1.0]


def test_a_row_without_a_generated_token_is_skipped_and_counted() -> None:
    result = build_rows(
        [rollout([triplet([1, 2], []), triplet([7], [8])])], TrajectoryConfig(level="transition")
    )
    assert len(result.rows) == 1
    assert result.metrics["no_trainable_rows"] == 1


class CharTokenizer:
    """Ids are indices into a table of strings, so two id sequences may spell the same text."""

    def __init__(self, table: dict[int, str]) -> None:
        self.table = table

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.table[i] for i in token_ids)


TOKENS = CharTokenizer(
    {1: "You", 2: " are", 3: " kind", 4: ".", 5: " ki", 6: "nd", 7: "  kind", 8: "Bye", 9: "!"}
)


@pytest.mark.parametrize(
    ("next_prompt", "kind"),
    [
        ([1, 2, 5, 6, 4, 9], "retokenization"),  # " kind" came back as " ki" + "nd": same text, other ids
        ([1, 2, 7, 4, 9], "template"),  # the template re-rendered the reply with different whitespace
        ([1, 8, 9], "rewrite"),  # the history was summarised away
    ],
)
def test_each_break_is_classified_with_both_decoded_texts(next_prompt: list[int], kind: str) -> None:
    calls = [triplet([1, 2], [3, 4]), triplet(next_prompt, [9])]
    result = build_rows([rollout(calls)], ROOMY, tokenizer=TOKENS)
    (merge_break,) = result.breaks
    assert merge_break.kind == kind
    assert merge_break.call_index == 1
    assert merge_break.expected_text == "You are kind."
    assert merge_break.actual_text is not None
    assert merge_break.actual_text.startswith(TOKENS.decode(next_prompt[:2]))
    assert result.metrics[f"breaks_{kind}"] == 1
    assert len(result.rows) == 2


def test_without_a_tokenizer_a_break_before_the_last_response_is_a_rewrite() -> None:
    calls = [triplet([1, 2], [3]), triplet([1, 8, 3, 4], [5]), triplet([1, 8, 3, 4, 6, 4], [6])]
    result = build_rows([rollout(calls)], ROOMY)
    assert result.breaks == [MergeBreak("r0", 1, "rewrite", 1), MergeBreak("r0", 2, "unclassified", 4)]


# -- several samples of one prompt (n > 1, or the same prompt sampled twice) ------------------------


def sampled(prompt: list[int], *responses: list[int]) -> Triplet:
    """A call whose prompt has several samples: the first is the triplet's own, the rest alternatives."""
    first, *others = responses
    alternatives = tuple(
        Sample(np.array(r, dtype=np.int64), np.full(len(r), -0.5 - k, dtype=np.float32), 1)
        for k, r in enumerate(others)
    )
    base = triplet(prompt, first, [-0.25] * len(first))
    return Triplet(base.prompt_ids, base.response_ids, base.logprobs, 1, alternatives)


def test_n_2_with_the_agent_going_on_with_choice_1_trains_choice_1_in_one_merged_row() -> None:
    calls = [sampled([1, 2], [3, 3], [4, 4]), triplet([1, 2, 4, 4, 9], [5], [-0.75])]
    result = build_rows([rollout(calls)], ROOMY, tokenizer=CharTokenizer({i: f"w{i} " for i in range(10)}))
    assert not result.breaks  # continuing choice 1 is no break, and certainly not a `rewrite`
    assert len(result.rows) == 1
    assert row_content(result.rows, 0) == ([1, 2], [4, 4, 9, 5], [1, 1, 0, 1])
    assert result.rows.old_logprobs[0, :4].tolist() == [-0.5, -0.5, 0.0, -0.75]  # choice 1's own
    assert (result.metrics["multi_sample_calls"], result.metrics["abandoned_samples"]) == (1, 1)
    assert result.metrics["unresolved_calls"] == 0


def test_a_prompt_sampled_twice_trains_the_sample_the_next_call_continues_counting_the_other() -> None:
    # The triplet view folds the earlier call into the later one (`replaced_calls`): here the agent
    # went on with the earlier answer, which v1.0's keep-the-last rule would have lost.
    calls = [sampled([1, 2], [6], [3]), triplet([1, 2, 3, 9], [5])]
    result = build_rows([rollout(calls)], ROOMY)
    assert [row_content(result.rows, 0)] == [([1, 2], [3, 9, 5], [1, 0, 1])]
    assert result.metrics["abandoned_samples"] == 1


def test_the_longest_sample_the_next_prompt_continues_wins() -> None:
    calls = [sampled([1], [2], [2, 3]), triplet([1, 2, 3, 4], [5])]
    assert row_content(build_rows([rollout(calls)], ROOMY).rows, 0) == ([1], [2, 3, 4, 5], [1, 1, 0, 1])


@pytest.mark.parametrize(
    ("rule", "rows", "dropped"),
    [("drop", [([1, 2], [3], [1])], 2), ("first_choice", [([1, 2], [3], [1]), ([1, 2, 3, 9], [5], [1])], 1)],
)
def test_a_last_call_with_several_samples_follows_the_unresolved_rule_and_is_counted(
    rule: str, rows: list[Any], dropped: int
) -> None:
    calls = [triplet([1, 2], [3]), sampled([1, 2, 3, 9], [5], [6])]
    config = ROOMY.model_copy(update={"unresolved_samples": rule, "level": "transition"})
    result = build_rows([rollout(calls)], config)
    assert [row_content(result.rows, i) for i in range(len(result.rows))] == rows
    assert (result.metrics["unresolved_calls"], result.metrics["unresolved_samples_dropped"]) == (1, dropped)


def test_after_dropped_samples_a_new_row_starts_its_break_named_against_the_closest_sample() -> None:
    # The next prompt continues neither sample: the history changed after id 3.
    calls = [sampled([1, 2], [3, 4], [3, 5]), triplet([1, 2, 3, 6], [6])]
    result = build_rows([rollout(calls)], ROOMY)
    assert [row_content(result.rows, 0)] == [([1, 2, 3, 6], [6], [1])]
    assert [(b.call_index, b.shared_prefix, b.kind) for b in result.breaks] == [(1, 3, "unclassified")]
    assert result.metrics["unresolved_calls"] == 1


def test_samples_are_resolved_by_the_next_call_of_the_same_conversation_across_interleaved_calls() -> None:
    calls = [sampled([1, 2], [3], [4]), triplet([8, 8], [9]), triplet([1, 2, 4, 0], [5])]
    result = build_rows([rollout(calls)], ROOMY.model_copy(update={"level": "transition"}))
    assert row_content(result.rows, 0) == ([1, 2], [4], [1])
    assert result.metrics["abandoned_samples"] == 1


@st.composite
def sampled_rollouts(draw: st.DrawFn) -> list[Triplet]:
    """`rollouts()` with some calls given extra samples, and the next prompt continuing any of them."""
    calls = draw(rollouts())
    out: list[Triplet] = []
    for k, call in enumerate(calls):
        extra = draw(st.lists(st.lists(st.integers(0, 6), max_size=4), max_size=2))
        if not extra:
            out.append(call)
            continue
        out.append(sampled(as_list(call.prompt_ids), as_list(call.response_ids), *extra))
        if k + 1 < len(calls) and draw(st.booleans()):  # the agent went on with one of the extra samples
            gap = draw(st.lists(st.integers(0, 6), max_size=3))
            calls[k + 1] = triplet([*as_list(call.prompt_ids), *draw(st.sampled_from(extra)), *gap], [1])
    return out


@PROPERTY
@given(calls=sampled_rollouts(), rule=st.sampled_from(["drop", "first_choice"]))
def test_every_sample_is_trained_or_counted_and_each_trained_one_is_a_sample_of_its_prompt(
    calls: list[Triplet], rule: str
) -> None:
    config = ROOMY.model_copy(update={"unresolved_samples": rule, "level": "transition"})
    result = build_rows([rollout(calls)], config)
    rows = result.rows
    for i in range(len(rows)):
        call = calls[int(rows.first_call[i])]
        _, response, _ = row_content(rows, i)
        assert response in [as_list(s.response_ids) for s in call.samples]
    total = sum(len(c.samples) for c in calls)
    metrics = result.metrics
    trained_samples = total - metrics["abandoned_samples"] - metrics["unresolved_samples_dropped"]
    empty = sum(1 for c in calls for s in c.samples if not len(s.response_ids))
    assert len(rows) <= trained_samples and len(rows) >= trained_samples - empty
    assert trained_samples == len(calls) - (metrics["unresolved_calls"] if rule == "drop" else 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rollouts())
def test_trajectories_are_build_rows_rows_unpadded(calls: list[Triplet]) -> None:
    """`trajectories` (what the dashboard shows) holds the rows `build_rows` trains on, before padding:
    the same prompts, response ids, masks, call indexes, and the same merge breaks."""
    config = TrajectoryConfig(max_prompt_len=512, max_response_len=512)  # nothing dropped or cut
    built = build_rows([rollout(calls)], config)
    shown, breaks = trajectories(rollout(calls), config)
    assert breaks == built.breaks
    kept = [t for t in shown if t.mask.any()]  # build_rows skips rows with nothing to train
    assert len(kept) == len(built.rows)
    for row, trajectory in enumerate(kept):
        n = len(trajectory.response_ids)
        p = built.rows.prompt_len
        assert built.rows.input_ids[row, p : p + n].tolist() == trajectory.response_ids.tolist()
        assert (
            built.rows.input_ids[row, p - len(trajectory.prompt_ids) : p].tolist()
            == trajectory.prompt_ids.tolist()
        )
        assert built.rows.response_mask[row, :n].tolist() == trajectory.mask.astype(int).tolist()
        assert built.rows.call_index[row, :n].tolist() == trajectory.call_index.tolist()

"""Merge breaks with a real engine: a 6-turn chat agent on vLLM, its rows built from the gateway's record.

vLLM renders the chat template over the agent's messages and tokenises the result, so an earlier
assistant turn reaches the next prompt as its text re-tokenised, not as the ids that were sampled:
where the two tokenisations differ, the next call no longer extends the previous prompt + response
and the row breaks (docs/training-data.md, "Rows"). This test runs a scripted agent (fixed user
turns, train temperature 1.0, a seed per call) for several conversations at once through the
proxy, builds trajectory rows from the triplets read back from the gateway, and checks that the
machinery explains every break: each one is classified with both decoded texts, and none is a
`rewrite` or `unclassified` (the agent never edits its history), and each lies in the previous
call's response, never in the history before it. It prints the measured break rate and every break
(both decoded texts, and the sampled and re-tokenised ids where they part), which
docs/training-data.md reports; `KERAUNOS_TEST_VLLM_CONVERSATIONS` (default 10) measures on more.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from vllm_support import CONVERSATIONS, TURNS, completed_rollout, run_conversation

from keraunos.testing.processes import Gateway
from keraunos.training.trajectories import TrajectoryConfig, build_rows

pytestmark = pytest.mark.timeout(600)


def test_a_six_turn_agent_on_vllm_builds_rows_and_every_merge_break_is_explained(
    vllm_gateway: Gateway, smollm2_tokenizer: Any
) -> None:
    # All conversations at once: vLLM batches them, as it would a real training step's rollouts.
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        rollout_ids = list(pool.map(lambda i: run_conversation(vllm_gateway, i), range(CONVERSATIONS)))
    rollouts = [completed_rollout(vllm_gateway, rollout_id) for rollout_id in rollout_ids]
    assert [len(r.triplets) for r in rollouts] == [TURNS] * CONVERSATIONS

    built = build_rows(
        rollouts, TrajectoryConfig(max_prompt_len=2048, max_response_len=2048), smollm2_tokenizer
    )

    pairs = CONVERSATIONS * (TURNS - 1)  # consecutive calls that could share a row
    kinds = Counter(b.kind for b in built.breaks)
    print(
        f"\nmerge breaks with vLLM: {len(built.breaks)} of {pairs} consecutive call pairs "
        f"({len(built.breaks) / pairs:.0%}); {dict(kinds)}; rows {len(built.rows)} for {CONVERSATIONS} rollouts"
    )
    by_id = {rollout.rollout_id: rollout for rollout in rollouts}
    end_of_turn = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for merge_break in built.breaks:
        triplets = by_id[merge_break.rollout_id].triplets
        previous, prompt = triplets[merge_break.call_index - 1], triplets[merge_break.call_index].prompt_ids
        # Nothing before the previous response differs: vLLM tokenises each message on its own.
        assert merge_break.shared_prefix >= len(previous.prompt_ids), merge_break
        at = merge_break.shared_prefix
        sampled = [*previous.prompt_ids, *previous.response_ids][at : at + 3]
        ended = "ended" if previous.response_ids[-1] == end_of_turn else "cut at max_tokens"
        print(
            f"  {merge_break.kind}, call {merge_break.call_index} (previous reply {ended}): sampled "
            f"{smollm2_tokenizer.convert_ids_to_tokens([int(i) for i in sampled])}, re-tokenised "
            f"{smollm2_tokenizer.convert_ids_to_tokens([int(i) for i in prompt[at : at + 3]])}\n"
            f"    sampled text      {merge_break.expected_text!r}\n    re-tokenised text {merge_break.actual_text!r}"
        )
    assert built.metrics["calls"] == CONVERSATIONS * TURNS
    # A break starts a new row; a call that extends the row joins it.
    assert len(built.rows) == CONVERSATIONS + len(built.breaks)
    assert built.metrics["breaks"] == len(built.breaks)
    for merge_break in built.breaks:
        assert merge_break.expected_text is not None and merge_break.actual_text is not None
        assert 0 < merge_break.call_index < TURNS
    # Nothing edited the history: every break is vLLM's re-tokenisation or template glue.
    assert set(kinds) <= {"retokenization", "template"}, built.breaks
    assert built.metrics["logprobs_missing_rows"] == 0

"""TrainBatch: rows + per-rollout advantages become what the trainer consumes (batch.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.torch.batch import BatchError, TrainBatch
from keraunos.training.credit import call_token_advantages
from keraunos.training.trajectories import Rows, TrajectoryConfig, build_rows


def rollout(rollout_id: str, prompt: list[int], *responses: list[int]) -> CompletedRollout:
    """One rollout whose calls continue each other exactly (one merged row), with log probs."""
    triplets, history = [], list(prompt)
    for response in responses:
        triplets.append(
            Triplet(np.array(history), np.array(response), np.full(len(response), -0.5, np.float32))
        )
        history += [*response, 99]  # a tool output id between the calls
    return CompletedRollout(rollout_id, "g", triplets, reward=1.0)


def rows_of(*rollouts: CompletedRollout, p: int = 8, r: int = 8) -> Rows:
    return build_rows(list(rollouts), TrajectoryConfig(max_prompt_len=p, max_response_len=r)).rows


def test_advantages_are_broadcast_to_trainable_tokens_and_every_rollout_weighs_the_same() -> None:
    rows = rows_of(rollout("a", [1, 2], [3, 4], [5]), rollout("b", [1, 2, 3], [6]))
    batch = TrainBatch.from_rows(rows, np.array([2.0, -1.0]))
    assert batch.response_mask.tolist()[0][:4] == [True, True, False, True]  # 3 4 | 99 | 5
    assert batch.advantages[0].tolist()[:4] == [2.0, 2.0, 0.0, 2.0]
    assert batch.advantages[1].tolist()[:2] == [-1.0, 0.0]
    assert batch.loss_weights[0].sum() == pytest.approx(0.5) and batch.loss_weights[1].sum() == pytest.approx(
        0.5
    )
    assert batch.temperatures.tolist() == [1.0, 1.0]
    assert batch.logprobs_valid.all() and batch.old_logprobs[0, 3] == -0.5


def test_temperature_is_one_number_or_one_per_rollout() -> None:
    rows = rows_of(rollout("a", [1], [3]), rollout("b", [1], [4]), rollout("c", [1], [5]))
    assert TrainBatch.from_rows(rows, np.zeros(3), 0.7).temperatures.tolist() == pytest.approx([0.7] * 3)
    per_rollout = TrainBatch.from_rows(rows, np.zeros(3), np.array([0.0, 0.5, 1.0]))
    assert per_rollout.temperatures.tolist() == [0.0, 0.5, 1.0]
    with pytest.raises(BatchError, match="one per rollout"):
        TrainBatch.from_rows(rows, np.zeros(3), np.array([1.0, 1.0]))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda b: {"advantages": np.full_like(b.advantages, np.nan)}, "advantages holds a non-finite"),
        (lambda b: {"temperatures": -b.temperatures}, "temperatures must be >= 0"),
        (lambda b: {"loss_weights": b.loss_weights[:, :3]}, "loss_weights has shape"),
        (lambda b: {"prompt_len": b.input_ids.shape[1]}, "must leave room for a response"),
        (lambda b: {"attention_mask": np.zeros_like(b.attention_mask)}, "row 0 has an empty prompt"),
        (
            lambda b: {"old_logprobs": np.full_like(b.old_logprobs, -np.inf)},
            "old_logprobs holds a non-finite value in a row marked valid",
        ),
    ],
)
def test_inconsistent_batches_are_refused_with_the_reason(
    spoil: Callable[[TrainBatch], dict[str, object]], message: str
) -> None:
    batch = TrainBatch.from_rows(rows_of(rollout("a", [1, 2], [3, 4])), np.array([1.0]))
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    with pytest.raises(BatchError, match=message):
        TrainBatch(**{**fields, **spoil(batch)}).validate()  # type: ignore[arg-type]


def test_rows_referring_to_missing_advantages_are_refused() -> None:
    rows = rows_of(rollout("a", [1], [3]), rollout("b", [1], [4]))
    with pytest.raises(BatchError, match="only 1 advantages"):
        TrainBatch.from_rows(rows, np.array([1.0]))


def test_trimming_drops_shared_padding_and_keeps_what_the_loss_needs() -> None:
    rows = rows_of(rollout("a", [1, 2], [3, 4]), rollout("b", [1, 2, 3], [6]), p=8, r=8)
    batch = TrainBatch.from_rows(rows, np.array([1.0, -1.0]))
    trimmed = batch.trimmed()
    assert trimmed.prompt_len == 3 and trimmed.response_len == 2
    assert trimmed.input_ids.tolist() == [[0, 1, 2, 3, 4], [1, 2, 3, 6, 0]]
    assert trimmed.position_ids.tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 0]]
    assert trimmed.response_mask.sum() == batch.response_mask.sum()
    assert trimmed.loss_weights.sum() == pytest.approx(batch.loss_weights.sum())
    assert trimmed.trimmed() is trimmed


def test_micro_batches_are_consecutive_slices_that_keep_the_global_weights() -> None:
    rows = rows_of(*(rollout(str(i), [1], [i + 3]) for i in range(5)))
    batch = TrainBatch.from_rows(rows, np.arange(5.0))
    parts = batch.micro_batches(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert sum(float(p.loss_weights.sum()) for p in parts) == pytest.approx(1.0)
    assert np.concatenate([p.rollout_index for p in parts]).tolist() == [0, 1, 2, 3, 4]


def test_rows_ordered_by_span_put_similar_lengths_together() -> None:
    rows = rows_of(
        rollout("long", [1, 2, 3, 4, 5], [6, 7, 8]),
        rollout("short", [1], [2]),
        rollout("middle", [1, 2], [3, 4]),
    )
    batch = TrainBatch.from_rows(rows, np.array([1.0, 2.0, 3.0]))
    ordered = batch.by_span()
    assert ordered.rollout_index.tolist() == [1, 2, 0]
    assert ordered.advantages[:, 0].tolist() == [2.0, 3.0, 1.0]
    assert (
        ordered.micro_batches(2)[0].trimmed().input_ids.shape[1]
        < batch.micro_batches(2)[0].trimmed().input_ids.shape[1]
    )


def test_per_token_advantages_from_per_call_ones_land_on_each_calls_ids_and_nowhere_else() -> None:
    rows = rows_of(rollout("a", [1], [2, 3], [4]), rollout("b", [1], [5]))
    per_call = [np.array([1.5, -2.0], np.float32), np.array([0.25], np.float32)]
    per_token = call_token_advantages(per_call, rows.rollout_index, rows.call_index, rows.response_mask)
    batch = TrainBatch.from_rows(rows, per_token, temperature=np.array([0.5, 1.0]))
    assert batch.advantages[0].tolist()[:4] == [1.5, 1.5, 0.0, -2.0]  # the tool output id between: 0
    assert batch.advantages[1].tolist()[:2] == [0.25, 0.0]
    assert batch.temperatures.tolist() == [0.5, 1.0]
    assert (batch.loss_weights == TrainBatch.from_rows(rows, np.zeros(2)).loss_weights).all()
    with pytest.raises(BatchError, match="per-token advantages have shape"):
        TrainBatch.from_rows(rows, per_token[:, :3])

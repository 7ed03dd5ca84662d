"""What one trainer step consumes: training rows with their advantages, loss weights and temperatures.

Plain NumPy, built from the row builder's output (`keraunos.training.trajectories.Rows`) and the
per-rollout advantages (`keraunos.training.advantages.rollout_advantages`), or per-token ones
built from per-call advantages (`keraunos.training.credit.call_token_advantages`). Every row is a
left-padded prompt of `prompt_len` ids followed by a right-padded response; the arrays of width
`R` cover the response part only. The trainer cuts the batch into micro-batches of rows and trims
each one's shared padding before the forward pass (`TrainBatch.trimmed`), which changes nothing
but the work done: position ids are explicit and padding is masked.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from keraunos.errors import InputError
from keraunos.training.advantages import rollout_loss_weights, token_advantages
from keraunos.training.trajectories import Rows


class BatchError(InputError):
    """The rows given to the trainer are inconsistent (shapes, empty prompts, non-finite values)."""


@dataclass(frozen=True)
class TrainBatch:
    """N training rows of `prompt_len + R` ids.

    `input_ids`, `attention_mask`, `position_ids`: (N, prompt_len + R). `response_mask`,
    `advantages`, `loss_weights`, `old_logprobs`: (N, R); the loss trains where `response_mask` is 1,
    each token with its advantage and weight. `old_logprobs` are the sampler's log probs, used
    where `logprobs_valid` (N,) is True (elsewhere the trainer's own, detached: ratio 1).
    `temperatures` (N,): the temperature each row was sampled at (0 = greedy, scored at 1 like the
    sampler reports it). `rollout_index` (N,): which rollout each row came from.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    response_mask: np.ndarray
    advantages: np.ndarray
    loss_weights: np.ndarray
    old_logprobs: np.ndarray
    logprobs_valid: np.ndarray
    temperatures: np.ndarray
    rollout_index: np.ndarray
    prompt_len: int

    @classmethod
    def from_rows(
        cls, rows: Rows, advantages: np.ndarray, temperature: float | np.ndarray = 1.0
    ) -> TrainBatch:
        """A batch from built rows and one advantage per rollout (indexed by `rows.rollout_index`),
        or an (N, R) array of per-token advantages (`call_token_advantages`), used where the
        response mask is 1.

        `temperature` is one number for every row, or one per rollout. The loss weights make every
        rollout count equally (`rollout_loss_weights`).
        """
        advantages = np.asarray(advantages, dtype=np.float32)
        index = np.asarray(rows.rollout_index, dtype=np.int64)
        per_token = advantages.ndim == 2
        if per_token:
            if advantages.shape != rows.response_mask.shape:
                raise BatchError(
                    f"per-token advantages have shape {advantages.shape}, the rows' responses "
                    f"{rows.response_mask.shape}"
                )
            token = advantages * (np.asarray(rows.response_mask) != 0)
        else:
            if index.size and int(index.max()) >= advantages.shape[0]:
                raise BatchError(
                    f"rows refer to rollout {int(index.max())} but only {advantages.shape[0]} advantages were given"
                )
            token = token_advantages(advantages, index, rows.response_mask)
        temps = np.asarray(temperature, dtype=np.float32)
        if temps.ndim == 0:
            temps = np.full(len(index), float(temps), dtype=np.float32)
        elif (
            temps.ndim != 1
            or (not per_token and temps.shape != advantages.shape)
            or (index.size and int(index.max()) >= temps.shape[0])
        ):
            expected = "" if per_token else f" ({advantages.shape[0]})"
            raise BatchError(f"give one temperature, or one per rollout{expected}, not {temps.shape}")
        else:
            temps = temps[index]
        batch = cls(
            input_ids=np.asarray(rows.input_ids, dtype=np.int64),
            attention_mask=np.asarray(rows.attention_mask, dtype=np.int64),
            position_ids=np.asarray(rows.position_ids, dtype=np.int64),
            response_mask=np.asarray(rows.response_mask, dtype=bool),
            advantages=token.astype(np.float32),
            loss_weights=rollout_loss_weights(rows.response_mask, index),
            old_logprobs=np.asarray(rows.old_logprobs, dtype=np.float32),
            logprobs_valid=np.asarray(rows.logprobs_valid, dtype=bool),
            temperatures=temps,
            rollout_index=index,
            prompt_len=int(rows.prompt_len),
        )
        batch.validate()
        return batch

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_len(self) -> int:
        """R: the width of the response part."""
        return int(self.input_ids.shape[1]) - self.prompt_len

    def validate(self) -> None:
        """Raise `BatchError` with the first inconsistency found (the trainer calls this)."""
        n = len(self)
        if self.input_ids.ndim != 2 or n == 0:
            raise BatchError(f"need a non-empty 2-D batch of input ids, got shape {self.input_ids.shape}")
        if not 1 <= self.prompt_len < self.input_ids.shape[1]:
            raise BatchError(
                f"prompt_len {self.prompt_len} must leave room for a response in rows of {self.input_ids.shape[1]}"
            )
        full, response = (n, self.input_ids.shape[1]), (n, self.response_len)
        for name, shape in (
            ("attention_mask", full),
            ("position_ids", full),
            ("response_mask", response),
            ("advantages", response),
            ("loss_weights", response),
            ("old_logprobs", response),
            ("logprobs_valid", (n,)),
            ("temperatures", (n,)),
            ("rollout_index", (n,)),
        ):
            if getattr(self, name).shape != shape:
                raise BatchError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
        empty = np.flatnonzero(self.attention_mask[:, self.prompt_len - 1] == 0)
        if empty.size:
            raise BatchError(
                f"row {int(empty[0])} has an empty prompt: its first response token has no context"
            )
        unattended = self.response_mask & (self.attention_mask[:, self.prompt_len :] == 0)
        if unattended.any():
            raise BatchError(f"row {int(np.argwhere(unattended)[0][0])} trains on a padding position")
        for name in ("advantages", "loss_weights", "temperatures"):
            if not np.isfinite(getattr(self, name)).all():
                raise BatchError(f"{name} holds a non-finite value")
        if (self.temperatures < 0).any():
            raise BatchError("temperatures must be >= 0")
        valid_old = np.where(self.response_mask & self.logprobs_valid[:, None], self.old_logprobs, 0.0)
        if not np.isfinite(valid_old).all():
            raise BatchError("old_logprobs holds a non-finite value in a row marked valid")

    def select(self, rows: slice | np.ndarray) -> TrainBatch:
        """The rows picked by a slice or an index array (the loss weights are kept as they are)."""
        picked = {f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name != "prompt_len"}
        return TrainBatch(**picked, prompt_len=self.prompt_len)

    def by_span(self) -> TrainBatch:
        """The rows ordered by span (first attended id to last trainable id), shortest first.

        Micro-batches cut from this order hold rows of similar length, so trimming removes more
        padding. The order changes no result: the loss weights are global to the batch.
        """
        first = np.argmax(self.attention_mask != 0, axis=1)
        trained = self.response_mask.any(axis=1)
        last = self.response_len - 1 - np.argmax(self.response_mask[:, ::-1], axis=1)
        span = np.where(trained, self.prompt_len + last - first, 0)
        return self.select(np.argsort(span, kind="stable"))

    def micro_batches(self, size: int, max_tokens: int = 0) -> list[TrainBatch]:
        """Consecutive slices of at most `size` rows and, when `max_tokens` > 0, at most that many
        ids once trimmed (rows times the slice's trimmed width; a row wider than that goes alone)."""
        if max_tokens <= 0:
            return [self.select(slice(start, start + size)) for start in range(0, len(self), size)]
        first = np.argmax(self.attention_mask[:, : self.prompt_len] != 0, axis=1)
        trained = self.response_mask.any(axis=1)
        last = np.where(trained, self.response_len - np.argmax(self.response_mask[:, ::-1], axis=1), 1)
        out: list[TrainBatch] = []
        start = 0
        while start < len(self):
            end = start + 1
            while end < len(self) and end - start < size:
                width = self.prompt_len - int(first[start : end + 1].min()) + int(last[start : end + 1].max())
                if (end + 1 - start) * width > max_tokens:
                    break
                end += 1
            out.append(self.select(slice(start, end)))
            start = end
        return out

    def trimmed(self) -> TrainBatch:
        """The same rows without the padding columns every row shares.

        Left: prompt columns no row attends to. Right: response columns after the last trainable
        token of any row (causal attention: later ids cannot change earlier log probs).
        """
        attended = self.attention_mask[:, : self.prompt_len].any(axis=0)
        left = int(np.argmax(attended)) if attended.any() else self.prompt_len - 1
        trained = self.response_mask.any(axis=0)
        right = int(np.flatnonzero(trained)[-1]) + 1 if trained.any() else 1
        if left == 0 and right == self.response_len:
            return self
        cols = slice(left, self.prompt_len + right)
        return replace(
            self,
            input_ids=self.input_ids[:, cols],
            attention_mask=self.attention_mask[:, cols],
            position_ids=self.position_ids[:, cols],
            response_mask=self.response_mask[:, :right],
            advantages=self.advantages[:, :right],
            loss_weights=self.loss_weights[:, :right],
            old_logprobs=self.old_logprobs[:, :right],
            prompt_len=self.prompt_len - left,
        )

"""Fixtures of the torch backend's tests: a tiny local model and a sampler that records log probs.

The model is `keraunos.serving.tiny` (a byte-level BPE tokenizer and a 2-layer Qwen2-style model
with random weights), built once per session. The sampler decodes with a KV cache, one prompt
length at a time and without padding, and reports the log probs of `keraunos.serving.sampling` —
what the model server reports — so the trainer's padded, full-sequence recomputation is checked
against an independent path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from keraunos.serving.sampling import draw, sampling_logprobs
from keraunos.serving.tiny import build_tiny_model, default_corpus
from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.advantages import AdvantageConfig, rollout_advantages
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.trajectories import TrajectoryConfig, build_rows

Sample = Callable[..., list[tuple[np.ndarray, np.ndarray]]]


@pytest.fixture(autouse=True)
def _few_threads() -> Iterator[None]:
    """Two cores are shared with other test processes: keep torch to one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-style model directory (hidden 64, 2 layers, vocabulary 512) with its tokenizer."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model",
        seed=0,
        hidden_size=64,
        layers=2,
        corpus=default_corpus(0, 300),
    )


@torch.no_grad()
def sample_responses(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(response ids, sampler log probs) per prompt: KV-cache decoding, prompts of one length together."""
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(prompts)
    # transformers 5 calls the KV cache `cache`; older releases `past_key_values`.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    for indices in by_length.values():
        ids = torch.tensor([list(prompts[i]) for i in indices], dtype=torch.long)
        temps = torch.full((len(indices),), temperature)
        top_ps = torch.ones(len(indices))
        result = model(input_ids=ids, use_cache=True)
        tokens: list[list[int]] = [[] for _ in indices]
        logprobs: list[list[float]] = [[] for _ in indices]
        for position in range(max_new_tokens):
            lp = sampling_logprobs(result.logits[:, -1], temps, top_ps)
            drawn = draw(lp, [temperature] * len(indices), [generator] * len(indices))
            for row, token in enumerate(drawn):
                tokens[row].append(token)
                logprobs[row].append(float(lp[row, token]))
            if position + 1 < max_new_tokens:
                step = torch.tensor(drawn, dtype=torch.long)[:, None]
                result = model(input_ids=step, use_cache=True, **{cache_arg: getattr(result, cache_arg)})
        for row, i in enumerate(indices):
            out[i] = (np.array(tokens[row], dtype=np.int64), np.array(logprobs[row], dtype=np.float32))
    return [item for item in out if item is not None]


@pytest.fixture
def sample() -> Sample:
    """`sample(model, prompts, max_new_tokens, temperature, generator)`: see `sample_responses`."""
    return sample_responses


def rollouts_to_batch(
    rollouts: list[CompletedRollout],
    temperature: float | np.ndarray = 1.0,
    max_prompt_len: int = 64,
    max_response_len: int = 32,
) -> TrainBatch:
    """The issue-5 pipeline: rows (trajectory level), GRPO advantages, then a `TrainBatch`."""
    rows = build_rows(
        rollouts, TrajectoryConfig(max_prompt_len=max_prompt_len, max_response_len=max_response_len)
    ).rows
    advantages = rollout_advantages(
        [r.reward for r in rollouts], [r.group_id for r in rollouts], AdvantageConfig()
    ).advantages
    return TrainBatch.from_rows(rows, advantages, temperature)


@pytest.fixture
def to_batch() -> Callable[..., TrainBatch]:
    """`to_batch(rollouts, temperature=1.0, max_prompt_len=64, max_response_len=32)`."""
    return rollouts_to_batch


def one_call_rollout(
    rollout_id: str,
    group_id: str,
    prompt: Sequence[int],
    response: np.ndarray,
    logprobs: np.ndarray,
    reward: float,
) -> CompletedRollout:
    """A single-call rollout."""
    triplet = Triplet(np.asarray(prompt, dtype=np.int64), response, logprobs)
    return CompletedRollout(rollout_id=rollout_id, group_id=group_id, triplets=[triplet], reward=reward)


@pytest.fixture
def make_rollout() -> Callable[..., CompletedRollout]:
    """`make_rollout(rollout_id, group_id, prompt, response, logprobs, reward)`: one call."""
    return one_call_rollout

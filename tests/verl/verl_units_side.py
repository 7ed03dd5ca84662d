"""Checks of the agent loop's pure parts that need verl's classes: run by `.venv-verl`'s python,
prints one JSON object (test_verl_units.py asserts on it)."""

from __future__ import annotations

import json
import sys

import numpy as np

from keraunos.training._data import CompletedRollout, Triplet
from keraunos.training.backends.verl.agent_loop import session_outputs
from keraunos.training.trajectories import TrajectoryConfig


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def main() -> None:
    config = TrajectoryConfig(max_prompt_len=16, max_response_len=16)
    logprobs = np.array([-0.5, -0.25], dtype=np.float32)
    first = Triplet(ids(1, 2), ids(3, 4), logprobs, model_version=5)
    rewritten = Triplet(ids(1, 9), ids(5, 6), None, model_version=6)  # a break, then no log probs
    mixed = CompletedRollout("r.0", "r", [first, rewritten], reward=1.0)
    complete = CompletedRollout("r.1", "r", [first], reward=0.5)
    outputs = session_outputs(mixed, config, tokenizer=None)
    out = {
        "mixed": [o.model_dump(mode="json", exclude={"metrics"}) for o in outputs],
        "complete": [
            o.model_dump(mode="json", exclude={"metrics"}) for o in session_outputs(complete, config, None)
        ],
        "none": session_outputs(None, config, None),
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""The Agent Lightning side of test_verl_agl_rollout_manager.py: run by `.venv-agl`'s python, it
drives Agent Lightning 1.0.2's own verl-side client (`agentlightning.verl.agl_rollout_manager`,
the rollout manager its verl trainer calls every step) against a keraunos gateway, unchanged:
register the model servers, create a step's rollouts, wait until they are terminal, read their
triplets and rewards, delete them. Prints what it got back as one JSON object.

Input (stdin, JSON): `server_url`, `key`, `model`, `server_address`, `n`, `questions`.
"""

from __future__ import annotations

import json
import sys

from agentlightning.verl.agl_rollout_manager import AglRolloutManager


def main() -> None:
    spec = json.load(sys.stdin)
    manager = AglRolloutManager(
        agl_base_url=spec["server_url"],
        agl_key=spec["key"],
        model=spec["model"],
        step=7,
        train_rollout_n=spec["n"],
        poll_interval_seconds=0.1,
    )
    models = manager.register_model([spec["server_address"]])
    completed = manager.enqueue_and_wait_until_completed({"question": spec["questions"]}, is_train=True)
    out = {
        "models": [m.model_dump(mode="json") for m in models],
        "rollouts": [
            {
                "rollout_id": c.rollout_id,
                "data_id": c.data_id,
                "input": c.input,
                "state": str(getattr(c.rollout_state, "value", c.rollout_state)),
                "final_reward": c.final_reward,
                "triplets": [t.model_dump(mode="json") for t in c.triplets or []],
            }
            for c in completed
        ],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

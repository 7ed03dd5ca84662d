"""The verl side of test_verl_agent_loop.py: run by `.venv-verl`'s python, it runs verl 0.9's own V1
agent-loop worker (`AgentLoopWorkerTQ`, a Ray actor) with TransferQueue on a local Ray cluster, hands
it a batch of samples as the V1 trainer does, lets it run `KeraunosAgentLoop` for each session
against the gateway, then runs the keraunos trainer's advantage step (`KeraunosSyncTrainer`'s
`_compute_advantage`: verl's own, then the per-rollout scaling) on what the worker stored, and its
`_update_actor` (verl's own) with a stand-in actor worker group that records what the actor would
be asked, and prints what TransferQueue holds as one JSON object.

Input (stdin, JSON): `server_url`, `key`, `run_id`, `model_dir`, `n`, `prompts` (one message list
per sample), `uids`, `global_steps`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
from hydra import compose, initialize_config_module
from transfer_queue.metadata import KVBatchMeta
from verl.trainer.ppo.v1 import AgentLoopWorkerTQ
from verl.utils import tensordict_utils as tu

from keraunos.serving.tiny import build_tiny_model
from keraunos.training.backends.verl.config import SETUP_HOOK, TRAINER_MODE, verl_overrides
from keraunos.training.backends.verl.trainer import KeraunosSyncTrainer

FIELDS = [
    "prompts",
    "responses",
    "response_mask",
    "loss_mask",
    "rollout_log_probs",
    "rm_scores",
    "advantages",
]


def main() -> None:
    spec = json.load(sys.stdin)
    model = Path(spec["model_dir"])
    if not (model / "config.json").exists():
        build_tiny_model(model)
    overrides = [
        *verl_overrides(group_size=spec["n"], batch_size=len(spec["uids"])),
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=256",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"+keraunos.server_url={spec['server_url']}",
        f"+keraunos.key={spec['key']}",
        f"+keraunos.run_id={spec['run_id']}",
        "+keraunos.poll_interval_s=0.05",
    ]
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)

    runtime_env = dict(config.ray_kwargs.ray_init.runtime_env)
    assert runtime_env["worker_process_setup_hook"] == SETUP_HOOK
    ray.init(num_cpus=4, include_dashboard=False, runtime_env=runtime_env)
    tq.init()

    @ray.remote
    def trainer_mode() -> str:
        from verl.trainer.ppo.v1 import get_trainer_cls

        return get_trainer_cls(TRAINER_MODE).__name__

    registered = ray.get(trainer_mode.remote())

    # What the V1 trainer does with a batch of samples (`_submit_batch_to_rollout`), then waits for.
    uids = spec["uids"]
    raw_prompt = np.empty(len(uids), dtype=object)
    raw_prompt[:] = spec["prompts"]
    samples = {
        "raw_prompt": raw_prompt,
        "data_source": np.array(["test"] * len(uids), dtype=object),
        "index": np.arange(len(uids)),
        "uid": np.array(uids, dtype=object),
    }
    batch = tu.get_tensordict(samples)
    tu.assign_non_tensor_data(batch, "global_steps", spec["global_steps"])
    tags = [{"is_prompt": True, "status": "pending", "global_steps": spec["global_steps"]} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    worker = AgentLoopWorkerTQ.remote(config, None, None, None)
    ray.get(worker.generate_sequences.remote(batch))

    deadline = time.monotonic() + 240
    while True:
        listing = tq.kv_list("train")["train"]
        statuses = {uid: listing[uid]["status"] for uid in uids}
        if all(s in ("finished", "failure") for s in statuses.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    keys = sorted(k for k, tag in listing.items() if not tag.get("is_prompt"))
    meta = KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id="train")
    # A trainer holding only the composed config: `_compute_advantage` reads only it and TransferQueue,
    # `_update_actor` it and the actor worker group.
    trainer = KeraunosSyncTrainer.__new__(KeraunosSyncTrainer)
    trainer.config = config
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(meta, metrics)
    asked: list[dict[str, Any]] = []

    def update_actor(batch: KVBatchMeta) -> dict[str, Any]:
        asked.append({"rows": len(batch), **{k: batch.extra_info[k] for k in ("mini_batch_size", "epochs")}})
        return {"metrics": {"mfu": 0.0}}

    trainer.actor_rollout_wg = SimpleNamespace(update_actor=update_actor)
    # A step verl's batch balancing padded to twice its mini-batch (ppo_mini_batch_size x n rows).
    padded = 2 * config.actor_rollout_ref.actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n
    step = KVBatchMeta(keys=[f"row{i}" for i in range(padded)], tags=[{}] * padded, partition_id="train")
    trainer._update_actor(step, metrics)
    asked[-1]["ppo_mini_batch_size_after"] = config.actor_rollout_ref.actor.ppo_mini_batch_size
    stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=[*FIELDS, "uid", "extra_fields"])

    def rows(name: str) -> list[Any]:
        return [t.tolist() for t in stored[name].unbind(0)]

    out = {
        "trainer_mode": registered,
        "update_actor": asked,
        "statuses": statuses,
        "keys": keys,
        "tags": [{k: listing[key].get(k) for k in ("min_global_steps", "max_global_steps")} for key in keys],
        "uid": [str(u) for u in stored["uid"]],
        "rollout_ids": [e["keraunos_rollout_id"] for e in stored["extra_fields"]],
        **{name: rows(name) for name in FIELDS},
    }
    tq.close()
    ray.shutdown()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

"""One rank of the data-parallel equivalence test, started with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): `python distributed_worker.py MODEL BATCH OUT`.

Loads the `TrainBatch` saved in BATCH (an .npz of its fields), applies one update with the trainer
sharded over the ranks, and on rank 0 writes the gathered weights to OUT/weights.safetensors, the
update's metrics to OUT/metrics.json and the gathered checkpoint to OUT/checkpoint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.distributed import init_from_env
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig


def main(model: str, batch_path: str, out: str) -> None:
    torch.set_num_threads(1)
    world = init_from_env("cpu")
    assert world is not None, "start me with WORLD_SIZE >= 2"
    saved = np.load(batch_path)
    batch = TrainBatch(
        **{k: saved[k] for k in saved.files if k != "prompt_len"}, prompt_len=int(saved["prompt_len"])
    )
    trainer = TorchTrainer(TorchTrainerConfig(model_path=model, device="cpu", lr=1e-2, micro_batch_size=2))
    metrics = trainer.step(batch)
    weights = trainer.state_dict()
    trainer.save_checkpoint(Path(out) / "checkpoint")  # a collective: rank 0 writes the gathered state
    if world.is_main:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(Path(out) / "weights.safetensors"))
        (Path(out) / "metrics.json").write_text(json.dumps(metrics))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])

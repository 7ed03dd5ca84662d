"""One rank of the data-parallel equivalence test, started with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
`python distributed_worker.py MODEL BATCH OUT [--lora RANK] [--steps N] [--resume CHECKPOINT]
[--checkpoint-before]`.

Loads the `TrainBatch` saved in BATCH (an .npz of its fields), builds the trainer over the ranks
(FSDP2; DDP with `--lora`) or resumes it from CHECKPOINT, applies N updates on that batch, and on
rank 0 writes the gathered weights to OUT/weights.safetensors and the last update's metrics to
OUT/metrics.json; a new trainer's checkpoint after its first update goes to OUT/checkpoint (and,
with `--checkpoint-before`, one before any update to OUT/before). Every
rank writes the weights it holds after resuming (OUT/resumed-<rank>.safetensors) and, with
`--lora`, its adapter after the updates (OUT/adapter-<rank>.safetensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.distributed import init_from_env
from keraunos.training.backends.torch.trainer import LoraSettings, TorchTrainer, TorchTrainerConfig


def worker_config(model: str, lora: int) -> TorchTrainerConfig:
    """The trainer of every rank, and of the one-process runs the test compares with."""
    return TorchTrainerConfig(
        model_path=model,
        device="cpu",
        lr=1e-2,
        micro_batch_size=2,
        lora=LoraSettings(rank=lora) if lora else None,
    )


def main(
    model: str, batch_path: str, out: str, lora: int, steps: int, resume: str | None, before: bool
) -> None:
    torch.set_num_threads(1)
    world = init_from_env("cpu")
    assert world is not None, "start me with WORLD_SIZE >= 2"
    saved = np.load(batch_path)
    batch = TrainBatch(
        **{k: saved[k] for k in saved.files if k != "prompt_len"}, prompt_len=int(saved["prompt_len"])
    )
    config = worker_config(model, lora)
    if resume:
        trainer = TorchTrainer.resume(resume, config)
        held = {n: _local(p) for n, p in trainer.model.named_parameters()}
        save_file(held, str(Path(out) / f"resumed-{world.rank}.safetensors"))
    else:
        trainer = TorchTrainer(config)
        if before:
            trainer.save_checkpoint(Path(out) / "before")
    metrics: dict[str, float] = {}
    for i in range(steps):
        metrics = trainer.step(batch)
        if i == 0 and not resume:  # a collective: rank 0 writes the gathered state
            trainer.save_checkpoint(Path(out) / "checkpoint")
    weights = trainer.state_dict()
    if lora:
        adapter = {n: _local(p) for n, p in trainer.model.named_parameters() if p.requires_grad}
        save_file(adapter, str(Path(out) / f"adapter-{world.rank}.safetensors"))
    if world.is_main:
        # clones: a tied head shares its tensor with the embedding, which safetensors refuses
        save_file(
            {k: v.clone().contiguous() for k, v in weights.items()}, str(Path(out) / "weights.safetensors")
        )
        (Path(out) / "metrics.json").write_text(json.dumps(metrics))
    dist.destroy_process_group()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (its shard under FSDP2, all of it otherwise), as a plain tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # pyright: ignore[reportAttributeAccessIssue]
    return local.detach().clone().contiguous()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("batch")
    parser.add_argument("out")
    parser.add_argument("--lora", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--checkpoint-before", action="store_true")
    args = parser.parse_args()
    main(args.model, args.batch, args.out, args.lora, args.steps, args.resume, args.checkpoint_before)

"""Data-parallel updates over several processes with PyTorch's own stack: `torch.distributed`,
FSDP2 (`torch.distributed.fsdp.fully_shard`) for full weights, DDP
(`torch.nn.parallel.DistributedDataParallel`) for a LoRA adapter.

Every rank holds the same full `TrainBatch` and takes its share of the rows (`shard_rows`: the
batch ordered by span, then every `size`-th row, so shards hold rows of similar length). The loss
weights are global to the whole batch (`keraunos.training.advantages.rollout_loss_weights`), so the
sum over ranks of each shard's gradient is the full batch's gradient; FSDP2 (in its reduce-scatter)
and DDP (in its all-reduce) both average gradients over ranks, so each rank's loss is multiplied by
the world size. FSDP2 gathers the weights of each layer in every forward pass and DDP all-reduces
in the last backward pass, both collectives: every rank runs the same number of micro-batches
(`padding_batch` tops the shorter shards up with a row of zero weight).

Why two wrappers: a LoRA adapter is a few megabytes, so every rank keeps the whole base and the
whole adapter (DDP: nothing to gather for a publish or a checkpoint, the adapter is the same on
every rank after each update); full weights are sharded so that N ranks hold one copy between them.

The process group comes from the environment torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
`MASTER_ADDR`, `MASTER_PORT`): gloo on CPU, NCCL on CUDA. Measured on CPU with gloo, 2 processes:
one update equals the single-process update within 1e-5 (tests/training_torch/test_torch_distributed.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.loss import LossSums


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks."""

    rank: int
    size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that runs the training loop and publishes."""
        return self.rank == 0


def current_world() -> World | None:
    """The initialised process group of more than one rank, or None (a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    rank = dist.get_rank()
    return World(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))


def init_from_env(device: str, *, timeout: timedelta | None = None) -> World | None:
    """Join the process group torchrun describes in the environment (None when `WORLD_SIZE` < 2).

    `device` is the trainer's (`cpu`, `cuda`, `auto`): NCCL with one GPU per local rank on CUDA,
    gloo otherwise. `timeout`: how long a collective may wait for the other ranks (torch's default
    when None).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    if not dist.is_initialized():
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    return current_world()


def shard_model(model: Any) -> None:
    """FSDP2 over `model`: each transformer block (the model's `_no_split_modules` classes) is one
    unit, the rest (embeddings, final norm, head) the root unit."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)


def replicate_model(model: Any, world: World, device: torch.device) -> Any:
    """DDP over `model` (a PEFT model: only the adapter requires grad, only it is all-reduced).

    Every parameter that trains is used in every forward pass, so `find_unused_parameters` stays
    off (it would walk the autograd graph each pass). DDP's default buffer broadcast in each
    forward pass stays: the ranks run the same number of them, and the buffers (rotary tables)
    are small.
    """
    from torch.nn.parallel import DistributedDataParallel

    device_ids = None
    if device.type == "cuda":
        device_ids = [device.index if device.index is not None else world.local_rank]
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False)


def shard_rows(batch: TrainBatch, world: World) -> TrainBatch:
    """This rank's rows of `batch` (possibly none): every `world.size`-th row in span order."""
    ordered = batch.by_span()
    return ordered.select(np.arange(world.rank, len(ordered), world.size))


def padding_batch(batch: TrainBatch) -> TrainBatch:
    """One row of `batch` that trains nothing (zero loss weights): a forward and backward pass that
    keeps a rank in step with the others and adds nothing to the gradient."""
    row = batch.select(slice(0, 1))
    return replace(row, loss_weights=np.zeros_like(row.loss_weights))


def most(value: int) -> int:
    """The largest `value` over all ranks."""
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def reduce_sums(
    sums: LossSums, diff: tuple[float, float, float]
) -> tuple[LossSums, tuple[float, float, float]]:
    """The loss statistics and the log-prob gap (total, max, tokens) summed over all ranks
    (maxima by max), so every rank reports the whole batch's numbers."""
    names = [name for name in vars(sums) if name != "ratio_max"]
    total = torch.tensor([getattr(sums, name) for name in names] + [diff[0], diff[2]], dtype=torch.float64)
    peak = torch.tensor([sums.ratio_max, diff[1]], dtype=torch.float64)
    dist.all_reduce(total)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    values = dict(zip(names, total.tolist()[: len(names)], strict=True))
    summed = LossSums(**values, ratio_max=float(peak[0]))
    return summed, (float(total[-2]), float(peak[1]), float(total[-1]))

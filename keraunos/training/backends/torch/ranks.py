"""`keraunos train --nproc-per-node N`: the torch backend over N data-parallel ranks.

The `keraunos train` process is rank 0: it runs everything a one-process run does (gateway,
controller, collector, loop, in-process server, publish) and starts ranks 1..N-1 itself, each a
`python -m keraunos.training.backends.torch.ranks` process with the environment torchrun would give
it (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`), the
trainer's settings as JSON and, on `--resume`, the checkpoint rank 0 resumes. Every rank builds the
same `TorchTrainer` (same settings, same seed, or the same checkpoint), which shards itself with
FSDP2 (full weights) or replicates its LoRA adapter with DDP (`distributed.py`). The other ranks
then only obey rank 0: before each of its own collective parts, rank 0 broadcasts one command
(`broadcast_object_list`):

    ("update", batch)      every rank runs `step(batch)` on its share of the rows
    ("state_dict",)        every rank takes part in gathering the full weights on rank 0 (publish;
                           a LoRA run publishes rank 0's adapter, which every rank holds, unsent)
    ("checkpoint", path)   every rank takes part in gathering weights and optimizer state; rank 0 writes
    ("stop",)              the rank leaves the process group and exits 0

A resumed run of full weights gathers them once more at start, for rank 0 to serve the
checkpoint's weights (`TorchBackend.open`); the other ranks join that gather unasked.

A rank that has exited is noticed before the next command (`RankError`); each rank stops with
rank 0 (`keraunos._parent`), and its output goes to RUN_DIR/logs/rank-<r>.log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
import torch.distributed as dist

from keraunos._parent import parent_env, watch_parent
from keraunos._subprocess import free_port, stop_process
from keraunos.errors import KeraunosError
from keraunos.training.backends.torch.backend import TorchBackend, trainer_config
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import latest_checkpoint, prune_checkpoints, step_dir
from keraunos.training.backends.torch.distributed import init_from_env
from keraunos.training.backends.torch.trainer import TorchTrainer, TorchTrainerConfig
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState
from keraunos.training.trajectories import Rows

log = structlog.get_logger("keraunos.training.ranks")

#: How long a rank waits in a collective: the other ranks wait for rank 0's next command while it
#: collects a step's rollouts, which may take long. A rank that dies closes its connections, which
#: the others notice at once; this only bounds a rank that hangs.
COLLECTIVE_TIMEOUT = timedelta(hours=24)

#: Seconds the ranks get to exit after ("stop",) before they are terminated.
STOP_GRACE_S = 30.0


class RankError(KeraunosError, RuntimeError):
    """A rank of a multi-process trainer exited or could not start."""


class Ranks:
    """Ranks 1..N-1 as rank 0 sees them: their processes, and the command channel to them."""

    def __init__(self, processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
        self.processes = processes
        self.logs = logs

    @classmethod
    def start(cls, config: TrainConfig, *, resume: Path | None = None) -> Ranks:
        """Start ranks 1..N-1 and join the process group as rank 0 (it waits for all of them).

        `resume`: the checkpoint every rank resumes from (rank 0 too: `TorchBackend.open`).
        """
        size = config.nproc_per_node
        port = free_port()
        logs = Path(config.run_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        settings = trainer_config(config).model_dump_json()
        processes = []
        for rank in range(1, size):
            env = dict(os.environ) | parent_env()
            env |= {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            with (logs / f"rank-{rank}.log").open("ab") as out:
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "keraunos.training.backends.torch.ranks",
                            settings,
                            str(resume or ""),
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                    )
                )
        ranks = cls(processes, logs)
        cuda = config.device != "cpu" and torch.cuda.is_available()
        try:
            if cuda:
                torch.cuda.set_device(0)
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=0,
                world_size=size,
                timeout=COLLECTIVE_TIMEOUT,
            )
        except BaseException:
            ranks.kill()
            raise
        log.info("ranks joined", world_size=size, backend=dist.get_backend())
        return ranks

    def send(self, *command: Any) -> None:
        """Broadcast `command` to every other rank (they then run their part of it)."""
        for rank, process in enumerate(self.processes, start=1):
            if process.poll() is not None:
                raise RankError(
                    f"trainer rank {rank} exited with status {process.returncode} "
                    f"(log: {self.logs / f'rank-{rank}.log'})"
                )
        dist.broadcast_object_list([command], src=0)

    def stop(self) -> None:
        """("stop",) to every rank, wait for them, leave the process group."""
        try:
            self.send("stop")
        except (RankError, RuntimeError) as exc:  # a rank gone already: terminate the others
            log.warning("stopping trainer ranks", error=str(exc))
        for process in self.processes:
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                stop_process(process, 5.0)
        dist.destroy_process_group()

    def kill(self) -> None:
        """Terminate every rank (rank 0 could not join them)."""
        for process in self.processes:
            stop_process(process, 5.0)


class DistributedTorchBackend(TorchBackend):
    """`TorchBackend` on rank 0 of N: each collective step is first sent to the other ranks."""

    ranks: Ranks

    @classmethod
    def open(cls, config: TrainConfig, *, checkpoints: Path | None = None) -> TorchBackend:
        resume = None
        if checkpoints is not None:
            # The checkpoint `TorchBackend.open` resumes below (nothing writes there meanwhile).
            resume = latest_checkpoint(checkpoints)
            if resume is None:
                raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
        ranks = Ranks.start(config, resume=resume)
        try:
            backend = super().open(config, checkpoints=checkpoints)
        except BaseException:
            ranks.kill()
            dist.destroy_process_group()
            raise
        assert isinstance(backend, DistributedTorchBackend)
        backend.ranks = ranks
        return backend

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        batch = TrainBatch.from_rows(rows, advantages, temperature=self._temperature)
        self.ranks.send("update", batch)
        return self.trainer.step(batch)

    def publish(self) -> int:
        if self.adapters is not None:  # rank 0's adapter is every rank's: nothing to gather
            return super().publish()
        self.ranks.send("state_dict")
        return int(self.server.load_weights(self.trainer.state_dict()))

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        path = step_dir(directory, state.completed_steps)
        if not path.exists():
            self.ranks.send("checkpoint", str(path))
            self.trainer.save_checkpoint(path, run_state=state.to_json())
        if self._keep:
            prune_checkpoints(directory, self._keep)
        return path

    def close(self) -> None:
        try:
            self.ranks.stop()
        finally:
            super().close()


def serve_rank(settings: TorchTrainerConfig, resume: Path | None = None) -> None:
    """Ranks 1..N-1: join the process group, build the trainer (or resume it from the checkpoint
    `resume`, as rank 0 does), obey rank 0 until ("stop",)."""
    world = init_from_env(settings.device, timeout=COLLECTIVE_TIMEOUT)
    if world is None:
        raise RankError("a trainer rank needs WORLD_SIZE >= 2 in its environment")
    if resume is None:
        trainer = TorchTrainer(settings)
    else:
        trainer = TorchTrainer.resume(resume, settings)
        if trainer.global_step and settings.lora is None:
            trainer.state_dict()  # rank 0 gathers the checkpoint's weights to serve them
    log.info("rank ready", rank=world.rank, world_size=world.size, step=trainer.global_step)
    while True:
        received: list[Any] = [None]
        dist.broadcast_object_list(received, src=0)
        name, *args = received[0]
        if name == "update":
            trainer.step(args[0])
        elif name == "state_dict":
            trainer.state_dict()
        elif name == "checkpoint":
            trainer.save_checkpoint(args[0])
        elif name == "stop":
            break
        else:
            raise RankError(f"rank {world.rank} got an unknown command {name!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    from keraunos._logging import configure_logging

    configure_logging("warning")
    watch_parent(os.environ)
    serve_rank(
        TorchTrainerConfig.model_validate(json.loads(sys.argv[1])),
        Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None,
    )

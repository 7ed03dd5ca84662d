"""The `endpoints` backend: a `TorchTrainer` trains, engine replicas in other processes serve.

`serving: endpoints` in the run's config: the replicas are running `keraunos serve` or vLLM servers
given by URL (`engine_urls`), or `engine_replicas` of them that the run starts itself
(`keraunos.training.stack.start_engines`, stopped with the run). The policy is the trainer's, so
the replicas must serve the same model: at open, and after every update, `publish` writes the
trainer's weights once, as a Hugging Face directory `RUN_DIR/weights/v<version>` (written beside,
then renamed: a replica never reads half a directory), and tells every live replica to load it,
all at once, each within `engine_publish_timeout_s`:

- `keraunos serve`: `POST /keraunos/weights {"path": DIR, "version": n}`; the answer's version
  must be n;
- vLLM (started with `VLLM_SERVER_DEV_MODE=1`): `POST /collective_rpc {"method":
  "reload_weights", "kwargs": {"weights_path": DIR}}` (vLLM's in-place reload from disk, every
  worker), then `POST /reset_prefix_cache` (cached prefixes were computed with the old weights).

A replica that fails (an error answer, a timeout, a refused connection) is out for good: it leaves
`endpoints`, so the loop removes it from the gateway's registry inside the same pause, and it is
logged as an error; it never goes on serving the old weights under the new version. When every
replica has failed the run stops (`TrainError`). The loop runs `publish` inside the gateway's
pause/drain window, so no call is in flight while the weights change (docs/training-loop.md
"Serving").
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import structlog

from keraunos.errors import KeraunosError
from keraunos.training.backends.torch.backend import trainer_config
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.trainer import TorchTrainer
from keraunos.training.errors import TrainError
from keraunos.training.stack import EngineChild, start_engines, wait_for_engines
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import RunState
from keraunos.training.trajectories import Rows

log = structlog.get_logger("keraunos.training.backends.external")

#: Weights directories kept under RUN_DIR/weights: the one served now and the one before it.
KEEP_WEIGHTS = 2


class ReplicaError(KeraunosError):
    """A replica did not take an update; the message says what it answered."""


@dataclass
class Replica:
    """One engine replica: its OpenAI base URL (with /v1), the version it serves (None: none of
    the run's yet), whether it failed an update (then it is out for the rest of the run), and its
    process when the run started it."""

    endpoint: str
    version: int | None = None
    out: bool = False
    engine: EngineChild | None = None

    @property
    def root(self) -> str:
        """The server's root URL (the weight routes are not under /v1)."""
        return self.endpoint.removesuffix("/v1")


def load_into_keraunos(client: httpx.Client, root: str, path: Path, version: int) -> None:
    """`keraunos serve`: swap in the safetensors of `path` as `version`."""
    response = client.post(f"{root}/keraunos/weights", json={"path": str(path), "version": version})
    if response.status_code != 200:
        raise ReplicaError(f"POST /keraunos/weights: HTTP {response.status_code}: {response.text[:200]}")
    served = response.json().get("version")
    if served != version:
        raise ReplicaError(f"POST /keraunos/weights answered version {served!r}, not {version}")


def load_into_vllm(client: httpx.Client, root: str, path: Path, version: int) -> None:
    """vLLM: reload every worker's weights in place from `path`, then drop the prefix cache."""
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
    response = client.post(f"{root}/collective_rpc", json=body)
    if response.status_code == 404:
        raise ReplicaError("POST /collective_rpc: 404 (start vLLM with VLLM_SERVER_DEV_MODE=1)")
    if response.status_code != 200:
        raise ReplicaError(
            f"POST /collective_rpc reload_weights: HTTP {response.status_code}: {response.text[:200]}"
        )
    response = client.post(f"{root}/reset_prefix_cache")
    if response.status_code != 200:
        raise ReplicaError(f"POST /reset_prefix_cache: HTTP {response.status_code}: {response.text[:200]}")


#: How weights reach a replica, by `engine_kind`.
LOADERS: dict[str, Callable[[httpx.Client, str, Path, int], None]] = {
    "keraunos": load_into_keraunos,
    "vllm": load_into_vllm,
}


class ExternalBackend:
    """A `Trainer` (keraunos.training.trainer): one `TorchTrainer`, N engine replicas behind the gateway."""

    def __init__(
        self,
        trainer: TorchTrainer,
        replicas: list[Replica],
        config: TrainConfig,
        *,
        restored: RunState | None = None,
    ) -> None:
        self.trainer = trainer
        self.replicas = replicas
        self._config = config
        self._load = LOADERS[config.engine_kind]
        self._weights = Path(config.run_dir) / "weights"
        self._restored = restored
        self._version = trainer.global_step
        #: Replicas the last `publish` took out of routing.
        self.failed_last: list[str] = []

    @classmethod
    def open(cls, config: TrainConfig, *, checkpoints: Path | None = None) -> ExternalBackend:
        """Start (or find) the replicas, load (or resume) the trainer, publish its weights to every
        replica; `TrainError` when a replica does not come up or none takes the weights.

        Raises `PolicyLoadError` or `CheckpointError` (`KeraunosError`s) and `FileNotFoundError`
        when `checkpoints` holds no checkpoint, like the torch backend.
        """
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        if getattr(config, "lora_rank", 0):
            raise TrainError(
                "serving: endpoints publishes full weights; train LoRA with serving: in_process for now"
            )
        engines: list[EngineChild] = []
        if config.engine_replicas:
            (Path(config.run_dir) / "logs").mkdir(parents=True, exist_ok=True)
            engines = start_engines(config, Path(config.run_dir), _engine_device(config.device))
        try:
            trainer, restored = _load_trainer(config, checkpoints)
            wait_for_engines(engines, config.engine_startup_timeout_s)
            replicas = (
                [Replica(e.endpoint, engine=e) for e in engines]
                if engines
                else [Replica(url) for url in config.engine_endpoints]
            )
            backend = cls(trainer, replicas, config, restored=restored)
            # Replicas given by URL may serve anything: from here on they serve the trainer's weights.
            backend.publish()
        except BaseException:
            for engine in engines:
                engine.child.stop()
            raise
        return backend

    @property
    def tokenizer(self) -> Any:
        return self.trainer.tokenizer

    @property
    def version(self) -> int:
        return self._version

    @property
    def restored(self) -> RunState | None:
        return self._restored

    @property
    def endpoints(self) -> list[str]:
        """The replicas serving the newest version (a replica that failed an update is not one)."""
        return [r.endpoint for r in self.replicas if not r.out and r.version == self._version]

    def update(self, rows: Rows, advantages: np.ndarray) -> dict[str, float]:
        temperature = self._config.temperature
        return self.trainer.step(TrainBatch.from_rows(rows, advantages, temperature=temperature))

    def publish(self) -> int:
        """Write the trainer's weights once, load them into every live replica at once; the version.

        Replicas that fail are logged, listed in `failed_last` and left out of `endpoints` from now
        on; `TrainError` when none is left.
        """
        version = self.trainer.global_step
        path = self._write_weights(version)
        live = [r for r in self.replicas if not r.out]
        timeout = self._config.engine_publish_timeout_s
        started = time.perf_counter()
        with (
            httpx.Client(timeout=timeout) as client,
            ThreadPoolExecutor(max_workers=max(len(live), 1)) as pool,
        ):
            outcomes = list(pool.map(lambda r: self._publish_one(client, r, path, version), live))
        self.failed_last = []
        for replica, error in zip(live, outcomes, strict=True):
            if error is None:
                replica.version = version
                continue
            replica.out = True
            self.failed_last.append(replica.endpoint)
            log.error(
                "replica did not take the update; taken out of routing",
                endpoint=replica.endpoint,
                version=version,
                error=error,
            )
            if replica.engine is not None:
                replica.engine.child.stop(grace=5.0)
        self._version = version
        if not self.endpoints:
            raise TrainError(
                f"no engine replica took version {version}: {'; '.join(self.failed_last)} failed "
                "(see the log lines above)"
            )
        log.info(
            "published",
            version=version,
            replicas=len(self.endpoints),
            failed=len(self.failed_last),
            seconds=round(time.perf_counter() - started, 3),
        )
        self._prune_weights()
        return version

    def checkpoint(self, directory: Path, state: RunState) -> Path:
        path = step_dir(directory, state.completed_steps)
        if not path.exists():
            self.trainer.save_checkpoint(path, run_state=state.to_json())
        if self._config.keep_checkpoints:
            prune_checkpoints(directory, self._config.keep_checkpoints)
        return path

    def close(self) -> None:
        """Stop the replicas the run started (those given by URL keep running)."""
        for replica in self.replicas:
            if replica.engine is not None:
                replica.engine.child.stop()

    # -- helpers ---------------------------------------------------------------------------------

    def _publish_one(self, client: httpx.Client, replica: Replica, path: Path, version: int) -> str | None:
        """Load `path` into `replica`; None when it did, else what went wrong."""
        if replica.engine is not None and replica.engine.child.process.poll() is not None:
            return f"its process exited with status {replica.engine.child.process.returncode}"
        try:
            self._load(client, replica.root, path, version)
        except ReplicaError as exc:
            return str(exc)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _write_weights(self, version: int) -> Path:
        """`RUN_DIR/weights/v<version>`, written once (kept when it exists: a retried publish)."""
        path = self._weights / f"v{version}"
        if path.is_dir():
            return path
        partial = self._weights / f".v{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        self.trainer.save_model(partial)
        partial.rename(path)
        return path

    def _prune_weights(self) -> None:
        """Remove all but the newest `KEEP_WEIGHTS` weights directories."""
        found = sorted(
            (p for p in self._weights.glob("v*") if p.is_dir() and p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )
        for old in found[:-KEEP_WEIGHTS]:
            shutil.rmtree(old, ignore_errors=True)


def _load_trainer(config: TrainConfig, checkpoints: Path | None) -> tuple[TorchTrainer, RunState | None]:
    """A fresh trainer, or the one saved in the newest entry of `checkpoints` with its run state."""
    settings = trainer_config(config)
    if checkpoints is None:
        return TorchTrainer(settings), None
    found = latest_checkpoint(checkpoints)
    if found is None:
        raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
    info = read_checkpoint(found)
    restored = (
        RunState.from_json(info.run_state)
        if info.run_state is not None
        else RunState(completed_steps=info.step, rows_taken=info.step * config.batch_size)
    )
    return TorchTrainer.resume(found, settings), restored


def _engine_device(device: str) -> str:
    """The device of started `keraunos serve` replicas: the run's, with `auto` resolved."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

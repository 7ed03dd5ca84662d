"""The `endpoints` backend: a `TorchTrainer` trains, engine replicas in other processes serve.

`serving: endpoints` in the run's config: the replicas are running `keraunos serve` or vLLM servers
given by URL (`engine_urls`), or `engine_replicas` of them that the run starts itself
(`keraunos.training.stack.start_engines`, stopped with the run); `engine_kind` says which, and so
how an update reaches them. The policy is the trainer's, so the replicas must serve the same model.

Full weights: at open, and after every update, `publish` writes the trainer's weights once, as a
Hugging Face directory `RUN_DIR/weights/v<version>` (written beside, then renamed: a replica never
reads half a directory), and tells every live replica to load it, all at once, each within
`engine_publish_timeout_s`:

- `keraunos serve`: `POST /keraunos/weights {"path": DIR, "version": n}`; the answer's version
  must be n;
- vLLM (started with `VLLM_SERVER_DEV_MODE=1`): `POST /collective_rpc {"method":
  "reload_weights", "kwargs": {"weights_path": DIR}}` (vLLM's in-place reload from disk, every
  worker), then `POST /reset_prefix_cache` (cached prefixes were computed with the old weights).

LoRA (`lora_rank`): the replicas serve the base model and keep it; `publish` writes the trainer's
adapter once, as `RUN_DIR/adapters/v<version>` (the same way), and loads it into every live
replica as `<served_model_name>-v<version>` (`adapter_name`), which becomes `served_as`: the loop
registers every endpoint with it and the gateway sends it as the model of every call. Version 0
is the base itself (nothing to publish before the first update; a resumed run re-publishes its
checkpoint's adapter at open):

- `keraunos serve`: `POST /keraunos/adapters {"name", "path"}`; the answer must list the name. It
  has no unload route: it unloads the adapter loaded longest ago itself past `--max-adapters`;
- vLLM (started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`):
  `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, after `POST /v1/unload_lora_adapter`
  of the same name (vLLM refuses a name it knows, and an adapter of that name left by an earlier
  run is not this run's); after each publish the run's adapters older than the previous version
  are unloaded, so a long run does not fill vLLM's adapter list.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import structlog

from keraunos.errors import KeraunosError
from keraunos.training.backends.torch.backend import KEEP_ADAPTERS, trainer_config
from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    step_dir,
)
from keraunos.training.backends.torch.trainer import TorchTrainer
from keraunos.training.errors import TrainError
from keraunos.training.registry import adapter_name
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
    the run's yet), whether it failed an update (then it is out for the rest of the run), its
    process when the run started it, and the names of the run's adapters it holds, oldest first."""

    endpoint: str
    version: int | None = None
    out: bool = False
    engine: EngineChild | None = None
    adapters: list[str] = field(default_factory=list)

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


def load_adapter_into_keraunos(client: httpx.Client, root: str, name: str, path: Path) -> None:
    """`keraunos serve`: load the PEFT adapter in `path` as `name` (a name it holds is replaced)."""
    response = client.post(f"{root}/keraunos/adapters", json={"name": name, "path": str(path)})
    if response.status_code != 200:
        raise ReplicaError(f"POST /keraunos/adapters: HTTP {response.status_code}: {response.text[:200]}")
    loaded = response.json().get("adapters")
    if not isinstance(loaded, list) or name not in loaded:
        raise ReplicaError(f"POST /keraunos/adapters answered adapters {loaded!r}, without {name!r}")


def load_adapter_into_vllm(client: httpx.Client, root: str, name: str, path: Path) -> None:
    """vLLM: load the PEFT adapter in `path` as `name`, unloading an adapter of that name first."""
    unload_adapter_from_vllm(client, root, name)
    body = {"lora_name": name, "lora_path": str(path)}
    response = client.post(f"{root}/v1/load_lora_adapter", json=body)
    if response.status_code != 200:
        # 404 is also what a vLLM without the route answers.
        hint = " (start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        raise ReplicaError(
            f"POST /v1/load_lora_adapter: HTTP {response.status_code}: {response.text[:200]}"
            + (hint if response.status_code == 404 else "")
        )


def unload_adapter_from_vllm(client: httpx.Client, root: str, name: str) -> None:
    """vLLM: unload the adapter `name`; one vLLM does not hold (404) is no error."""
    response = client.post(f"{root}/v1/unload_lora_adapter", json={"lora_name": name})
    if response.status_code not in (200, 404):
        raise ReplicaError(
            f"POST /v1/unload_lora_adapter: HTTP {response.status_code}: {response.text[:200]}"
        )


#: How a LoRA adapter reaches a replica, by `engine_kind`.
ADAPTER_LOADERS: dict[str, Callable[[httpx.Client, str, str, Path], None]] = {
    "keraunos": load_adapter_into_keraunos,
    "vllm": load_adapter_into_vllm,
}
#: How a replica lets go of an old adapter, by `engine_kind` (none: the engine unloads by itself).
ADAPTER_UNLOADERS: dict[str, Callable[[httpx.Client, str, str], None] | None] = {
    "keraunos": None,
    "vllm": unload_adapter_from_vllm,
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
        # LoRA: adapters are published instead of weights; the replicas keep the base.
        self._lora = bool(config.lora_rank)
        self._published = Path(config.run_dir) / ("adapters" if self._lora else "weights")
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
            if config.lora_rank and not trainer.global_step:
                # Version 0 of a LoRA run is the base model the replicas were started with.
                for replica in replicas:
                    replica.version = 0
            else:
                # Replicas given by URL may serve anything: from here on they serve the trainer's
                # weights (a resumed LoRA run: its checkpoint's adapter).
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
    def served_as(self) -> str | None:
        """The model name that selects the current version on the replicas: a LoRA run's adapter of
        that version (None: the served model name itself, full weights or no update yet)."""
        if not self._lora or not self._version:
            return None
        return adapter_name(self._config.served_model_name, self._version)

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
        """Write the trainer's weights (LoRA: its adapter) once, load them into every live replica
        at once; the version.

        Replicas that fail are logged, listed in `failed_last` and left out of `endpoints` from now
        on; `TrainError` when none is left.
        """
        version = self.trainer.global_step
        path = self._write(version)
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
            adapter=self.served_as,
            replicas=len(self.endpoints),
            failed=len(self.failed_last),
            seconds=round(time.perf_counter() - started, 3),
        )
        self._prune()
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
        name = adapter_name(self._config.served_model_name, version)
        try:
            if self._lora:
                ADAPTER_LOADERS[self._config.engine_kind](client, replica.root, name, path)
            else:
                self._load(client, replica.root, path, version)
        except ReplicaError as exc:
            return str(exc)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if self._lora:
            replica.adapters = [a for a in replica.adapters if a != name] + [name]
            self._unload_old(client, replica)
        return None

    def _unload_old(self, client: httpx.Client, replica: Replica) -> None:
        """Unload the run's adapters older than the previous version from `replica`; a failure is
        logged only (no call is routed to an old adapter, it only takes up a slot)."""
        old, replica.adapters = replica.adapters[:-KEEP_ADAPTERS], replica.adapters[-KEEP_ADAPTERS:]
        unload = ADAPTER_UNLOADERS[self._config.engine_kind]
        if unload is None:
            return  # the engine unloads the adapter loaded longest ago itself
        for name in old:
            try:
                unload(client, replica.root, name)
            except (ReplicaError, httpx.HTTPError) as exc:
                log.warning(
                    "could not unload an old adapter", endpoint=replica.endpoint, adapter=name, error=str(exc)
                )

    def _write(self, version: int) -> Path:
        """`RUN_DIR/weights/v<version>` (LoRA: `RUN_DIR/adapters/v<version>`), written beside and
        renamed into place. A directory of that version left by a killed run is replaced: the
        resumed trainer's update of that version is not the killed one's."""
        path = self._published / f"v{version}"
        partial = self._published / f".v{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        if self._lora:
            self.trainer.save_adapter(partial)
        else:
            self.trainer.save_model(partial)
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
        return path

    def _prune(self) -> None:
        """Remove all but the newest `KEEP_WEIGHTS` weights (`KEEP_ADAPTERS` adapter) directories."""
        keep = KEEP_ADAPTERS if self._lora else KEEP_WEIGHTS
        found = sorted(
            (p for p in self._published.glob("v*") if p.is_dir() and p.name[1:].isdigit()),
            key=lambda p: int(p.name[1:]),
        )
        for old in found[:-keep]:
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

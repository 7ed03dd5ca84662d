"""Trainer checkpoints on disk: a loadable model directory plus the optimizer, step and config.

Layout of one checkpoint directory:

    model/                  the policy as `save_pretrained` writes it (model.safetensors, config.json,
                            generation config) and its tokenizer: any Hugging Face loader, the
                            model server included, reads it as it is. A LoRA trainer's is its
                            PEFT adapter instead (adapter_config.json, adapter_model.safetensors),
                            on the base model the checkpoint's config names
    trainer.safetensors     the optimizer state (one tensor per parameter and state key, named
                            `optimizer/<parameter>/<key>`) and the random number generator states
                            (`rng/cpu`, `rng/cuda/<i>`); its metadata holds `format`, `step`, the
                            trainer config and the optimizer's parameter groups, as JSON, and the
                            training loop's `run_state` (keraunos.training.trainer.RunState) when
                            the loop saved one

A checkpoint is written under a temporary name and renamed into place, so a directory with the
final name is always complete; an existing one is never overwritten. The weights and the loop's
state are in the same directory, so a run killed at any moment finds both of one step or neither.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from keraunos.errors import KeraunosError

FORMAT = "keraunos-torch-trainer/1"
MODEL_DIR = "model"
ADAPTER_CONFIG = "adapter_config.json"
STATE_FILE = "trainer.safetensors"
_STEP_DIR = re.compile(r"^step-(\d+)\Z")


class CheckpointError(KeraunosError, RuntimeError):
    """A checkpoint directory is missing, incomplete, or not one this trainer wrote."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about itself: the trainer's update count (`step`), its config, the
    training loop's run state (None in checkpoints written without one), and whether `model/` is
    a LoRA adapter rather than full weights."""

    path: Path
    step: int
    config: dict[str, Any]
    run_state: dict[str, Any] | None = None
    adapter: bool = False


def step_dir(root: str | Path, step: int) -> Path:
    """The conventional checkpoint directory for `step` under `root`: `root/step-<step>`."""
    return Path(root) / f"step-{step}"


def latest_checkpoint(root: str | Path) -> Path | None:
    """The `step-<n>` directory with the highest n under `root` (None when there is none)."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = [
        (int(match.group(1)), child)
        for child in root.iterdir()
        if (match := _STEP_DIR.match(child.name)) and (child / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Remove all but the `keep` highest `step-<n>` directories under `root`; the removed ones.

    Each is renamed out of the `step-<n>` pattern before its files go, so a kill halfway leaves no
    partial checkpoint that `latest_checkpoint` could pick (the newest one is never touched).
    """
    root = Path(root)
    found = sorted(
        (int(match.group(1)), child)
        for child in root.iterdir()
        if (match := _STEP_DIR.match(child.name)) and child.is_dir()
    )
    removed = [path for _, path in found[: max(0, len(found) - keep)]]
    for path in removed:
        doomed = path.with_name(f".{path.name}.removing-{os.getpid()}")
        path.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return removed


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    parameter_names: list[str],
    step: int,
    config: dict[str, Any],
    run_state: dict[str, Any] | None = None,
    full_state: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> Path:
    """Write a checkpoint to `path` (which must not exist yet); returns it.

    `parameter_names[i]` names the optimizer's i-th parameter, so the state is stored by name and
    survives a change in parameter order. `run_state` (JSON-able) is stored beside it, as it is.
    `full_state`: the model's and the optimizer's full state dicts gathered from the ranks of a
    sharded trainer (`torch.distributed.checkpoint.state_dict.get_state_dict`, parameters by name),
    written instead of `model`'s and `optimizer`'s own, so the checkpoint is the same as a single
    process writes.
    """
    path = Path(path)
    if path.exists():
        raise CheckpointError(f"{path} already exists: checkpoints are never overwritten, pick another path")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if full_state is None:
            model.save_pretrained(tmp / MODEL_DIR)
            tensors, groups = _optimizer_tensors(optimizer.state_dict(), parameter_names)
        else:
            model.save_pretrained(tmp / MODEL_DIR, state_dict=full_state[0])
            tensors, groups = _optimizer_tensors(full_state[1], None)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / MODEL_DIR)
        tensors.update(_rng_tensors())
        metadata = {
            "format": FORMAT,
            "step": str(step),
            "config": json.dumps(config, sort_keys=True),
            "param_groups": json.dumps(groups),
        }
        if run_state is not None:
            metadata["run_state"] = json.dumps(run_state, sort_keys=True)
        save_file(tensors, str(tmp / STATE_FILE), metadata=metadata)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_checkpoint(path: str | Path) -> CheckpointInfo:
    """The step and config of the checkpoint in `path`, checking that it is complete."""
    path = Path(path)
    state = path / STATE_FILE
    adapter = (path / MODEL_DIR / ADAPTER_CONFIG).is_file()
    if not state.is_file() or not (adapter or (path / MODEL_DIR / "config.json").is_file()):
        raise CheckpointError(f"{path} is not a trainer checkpoint (needs {STATE_FILE} and {MODEL_DIR}/)")
    metadata = _metadata(state)
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{state} has format {metadata.get('format')!r}, expected {FORMAT!r}")
    return CheckpointInfo(
        path=path,
        step=int(metadata["step"]),
        config=json.loads(metadata["config"]),
        run_state=json.loads(metadata["run_state"]) if "run_state" in metadata else None,
        adapter=adapter,
    )


def read_optimizer_state(path: str | Path, parameter_names: list[str]) -> dict[str, Any]:
    """The optimizer state of the checkpoint in `path` keyed by parameter name (`{"state": {name:
    {field: tensor}}, "param_groups": [{..., "params": [name, ...]}]}`): the full optimizer state
    dict `torch.distributed.checkpoint.state_dict.set_optimizer_state_dict` takes. Raises
    `CheckpointError` when it holds other parameters than `parameter_names`."""
    state_file = Path(path) / STATE_FILE
    metadata = _metadata(state_file)
    groups = json.loads(metadata["param_groups"])
    saved_names = [name for group in groups for name in group["params"]]
    if sorted(saved_names) != sorted(parameter_names):
        missing = sorted(set(parameter_names) ^ set(saved_names))[:3]
        raise CheckpointError(f"{state_file} holds the optimizer of other parameters (differ: {missing})")
    state: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(state_file), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if key.startswith("optimizer/"):
                name, _, field = key[len("optimizer/") :].rpartition("/")
                state.setdefault(name, {})[field] = handle.get_tensor(key)
    for group in groups:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def load_optimizer_state(
    path: str | Path, optimizer: torch.optim.Optimizer, parameter_names: list[str]
) -> None:
    """Load the optimizer state of the checkpoint in `path` into `optimizer` (same parameters, by name)."""
    saved = read_optimizer_state(path, parameter_names)
    index = {name: i for i, name in enumerate(parameter_names)}
    state = {index[name]: fields for name, fields in saved["state"].items()}
    param_groups = [
        dict(group, params=[index[name] for name in group["params"]]) for group in saved["param_groups"]
    ]
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def load_rng_state(path: str | Path) -> None:
    """Restore torch's random number generators (CPU, and CUDA when both sides have it)."""
    with safe_open(str(Path(path) / STATE_FILE), framework="pt") as handle:
        keys = set(handle.keys())
        if "rng/cpu" in keys:
            torch.set_rng_state(handle.get_tensor("rng/cpu"))
        if torch.cuda.is_available():
            cuda = sorted(
                (k for k in keys if k.startswith("rng/cuda/")), key=lambda k: int(k.rsplit("/", 1)[1])
            )
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all([handle.get_tensor(k) for k in cuda])


def _optimizer_tensors(
    saved: dict[str, Any], parameter_names: list[str] | None
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """The tensors and parameter groups of an optimizer state dict, by parameter name: its own
    keys are indices into `parameter_names`, or (None) names already."""

    def name(key: Any) -> str:
        return str(key) if parameter_names is None else parameter_names[key]

    tensors: dict[str, torch.Tensor] = {}
    for key, entries in saved["state"].items():
        for field, value in entries.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"optimizer/{name(key)}/{field}"] = tensor.detach().cpu().contiguous()
    groups = [{**group, "params": [name(key) for key in group["params"]]} for group in saved["param_groups"]]
    return tensors, groups


def _rng_tensors() -> dict[str, torch.Tensor]:
    tensors = {"rng/cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = state
    return tensors


def _metadata(state_file: Path) -> dict[str, str]:
    try:
        with safe_open(str(state_file), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {state_file}: {error}") from error

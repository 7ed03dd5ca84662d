"""TorchBackend as the training loop sees it (the `Trainer` protocol): checkpoints named by the
loop's completed steps, not by the trainer's update count, with the loop's run state inside, the
newest few kept; a resumed backend hands that state back."""

from __future__ import annotations

from pathlib import Path

from keraunos.training.backends.torch.backend import TorchBackend
from keraunos.training.backends.torch.checkpoint import read_checkpoint, save_checkpoint, step_dir
from keraunos.training.train_config import TrainConfig
from keraunos.training.trainer import PendingGroup, RunState, Trainer


def config_for(model: Path, **knobs: object) -> TrainConfig:
    return TrainConfig.load(
        {"dataset": "rows.jsonl", "model": str(model), "agent_class": "a:B", "device": "cpu", **knobs}
    )


def test_checkpoints_count_steps_not_updates_and_a_resumed_backend_returns_the_run_state(
    tiny_model: Path, tmp_path: Path
) -> None:
    backend = TorchBackend.open(config_for(tiny_model, keep_checkpoints=2))
    try:
        assert isinstance(backend, Trainer) and backend.restored is None
        # Three steps without an update (no rows, or skipped): the trainer's count stays 0.
        pending = (PendingGroup(2, 0, {"prompt": "a"}), PendingGroup(2, 1, ["b", 2]))
        for done in (1, 2, 3):
            state = RunState(completed_steps=done, rows_taken=4 * done, pending=pending[: done - 1])
            assert backend.checkpoint(tmp_path, state) == step_dir(tmp_path, done)
        assert backend.trainer.global_step == 0
        # Writing the same step again keeps the entry (the last step is checkpointed once).
        assert backend.checkpoint(tmp_path, RunState(completed_steps=3)) == step_dir(tmp_path, 3)
    finally:
        backend.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]  # the newest two

    resumed = TorchBackend.open(config_for(tiny_model), checkpoints=tmp_path)
    try:
        assert resumed.restored == RunState(completed_steps=3, rows_taken=12, pending=pending)
        assert resumed.version == 0 and resumed.trainer.global_step == 0
    finally:
        resumed.close()


def test_a_checkpoint_without_a_run_state_resumes_at_its_update_count(
    tiny_model: Path, tmp_path: Path
) -> None:
    backend = TorchBackend.open(config_for(tiny_model))
    try:
        trainer = backend.trainer
        trainer.global_step = 5
        save_checkpoint(
            step_dir(tmp_path, 5),
            model=trainer.model,
            tokenizer=trainer.tokenizer,
            optimizer=trainer.optimizer,
            parameter_names=trainer.parameter_names,
            step=5,
            config=trainer.config.model_dump(mode="json"),
        )
    finally:
        backend.close()
    assert read_checkpoint(step_dir(tmp_path, 5)).run_state is None
    resumed = TorchBackend.open(config_for(tiny_model, batch_size=3), checkpoints=tmp_path)
    try:
        assert resumed.restored == RunState(completed_steps=5, rows_taken=15)
        assert resumed.version == 5
    finally:
        resumed.close()


def test_a_lora_backend_publishes_each_update_as_a_named_adapter_and_resumes_serving_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    import httpx

    from keraunos.training.backends.torch.trainer import LoraSettings

    config = config_for(tiny_model, lora_rank=4, run_dir=str(tmp_path / "run"), served_model_name="policy")
    backend = TorchBackend.open(config)
    try:
        assert backend.trainer.config.lora == LoraSettings(rank=4)
        assert backend.version == 0 and backend.served_as is None  # the base serves version 0
        backend.trainer.global_step = 1  # as an update leaves it
        assert backend.publish() == 1 and backend.served_as == "policy-v1"
        assert (tmp_path / "run" / "adapters" / "v1" / "adapter_config.json").is_file()
        models = httpx.get(f"{backend.endpoints[0]}/models").json()["data"]
        assert [m["id"] for m in models] == ["policy", "policy-v1"]
        backend.checkpoint(tmp_path / "ckpt", RunState(completed_steps=1))
    finally:
        backend.close()
    resumed = TorchBackend.open(config, checkpoints=tmp_path / "ckpt")
    try:
        assert resumed.version == 1 and resumed.served_as == "policy-v1"
        assert "policy-v1" in resumed.server.runner.adapters
    finally:
        resumed.close()

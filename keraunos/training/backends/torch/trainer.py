"""`TorchTrainer`: GRPO updates of a Hugging Face causal LM on one device (CPU or one GPU).

One `step(batch)` is one optimizer update over a whole `TrainBatch`:

1. the batch is cut into micro-batches of `micro_batch_size` rows of similar length, each trimmed
   of the padding its rows share;
2. per micro-batch: the policy's log probs at the rows' temperatures (and the frozen reference's,
   when `kl_coef > 0`), the loss of `loss.policy_loss`, `backward()`. The loss weights are global
   to the batch, so the accumulated gradient is the whole batch's gradient;
3. gradient clipping to `max_grad_norm`, then AdamW (a step whose gradient is not finite is
   skipped and reported, the weights stay as they were).

The ratio's denominator is the sampler's log prob where the row has a complete, finite set of them
(`logprobs_valid`) and `recompute_old_logprobs` is off; otherwise it is the trainer's own, detached
(ratio 1: plain policy gradient). `logprob_diff_*` metrics compare both where both exist: on-policy
they stay near 0, a larger value means stale samples or a sampler that disagrees with the trainer.

The config is the whole truth about a run: `save_checkpoint` stores it with the weights, the
optimizer state and the step, and `TorchTrainer.resume` continues exactly where the run stopped.

Built inside a process group of several ranks (torchrun's environment), the trainer is one of N
data-parallel ranks (`distributed.py`): FSDP2 shards full weights, DDP replicates a LoRA adapter;
every rank calls `step`, `state_dict`, `save_checkpoint` and `resume` alike.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import structlog
import torch
from pydantic import BaseModel, ConfigDict, Field

from keraunos.training.backends.torch.batch import TrainBatch
from keraunos.training.backends.torch.checkpoint import (
    MODEL_DIR,
    CheckpointError,
    load_optimizer_state,
    load_rng_state,
    read_checkpoint,
    read_optimizer_state,
    save_checkpoint,
)
from keraunos.training.backends.torch.distributed import (
    current_world,
    most,
    padding_batch,
    reduce_sums,
    replicate_model,
    shard_model,
    shard_rows,
)
from keraunos.training.backends.torch.loss import LossSums, policy_loss
from keraunos.training.backends.torch.policy import (
    PolicyLoadError,
    enable_gradient_checkpointing,
    load_policy,
    pick_device,
    response_logprobs,
)

log = structlog.get_logger("keraunos.training.torch")

#: The projections of a Qwen2/Llama-style decoder block (attention and MLP), which SmolLM2 and the
#: tiny model share: LoRA's default targets.
DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class LoraSettings(BaseModel):
    """A PEFT LoRA adapter trained instead of the full weights (`peft.LoraConfig`, dropout 0).

    Dropout stays 0: the policy that is trained must be the one that sampled (log probs equal to
    the served ones), and the adapter's dropout would only act in training mode anyway.
    """

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=1, description="LoRA rank r of every adapted projection.")
    alpha: int = Field(default=16, gt=0, description="LoRA alpha: the update is scaled by alpha / rank.")
    target_modules: tuple[str, ...] = Field(
        default=DEFAULT_LORA_TARGETS, min_length=1, description="Names of the linear layers adapted."
    )


class TorchTrainerConfig(BaseModel):
    """Every knob of the built-in trainer, with its default."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(description="Directory of the Hugging Face causal LM and tokenizer to train.")
    device: str = Field(default="auto", description="Torch device: cpu, cuda, cuda:1, or auto (cuda if any).")
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Weights dtype. float32 keeps trainer and sampler log probs equal to 1e-4.",
    )
    attn_implementation: str | None = Field(
        default=None, description="Attention kernel passed to transformers (eager, sdpa); None = its default."
    )
    lr: float = Field(default=1e-6, gt=0, description="AdamW learning rate (after warm-up).")
    warmup_steps: int = Field(default=0, ge=0, description="Steps of linear learning-rate warm-up from 0.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    weight_decay: float = Field(
        default=0.0, ge=0, description="AdamW decoupled weight decay, on matrices only (not biases, norms)."
    )
    max_grad_norm: float = Field(
        default=1.0, ge=0, description="Clip the global gradient norm to this; 0 = no clipping."
    )
    micro_batch_size: int = Field(
        default=8, ge=1, description="Rows per forward/backward pass; gradients accumulate over the batch."
    )
    micro_batch_tokens: int = Field(
        default=0,
        ge=0,
        description="Most ids per forward/backward pass (rows times trimmed width; a longer row goes "
        "alone); 0 = rows only. Bounds activation memory when row lengths vary.",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute each transformer block's activations in the backward pass (less "
        "memory, one more forward of compute); the results are the same.",
    )
    bf16_autocast: bool = Field(
        default=False,
        description="CUDA only: forward passes under torch.autocast(bfloat16) (weights and AdamW stay "
        "in dtype); refused on other devices, where it would be slow or unsupported.",
    )
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="Ratio clip below: 1 - clip_low.")
    clip_high: float = Field(default=0.2, ge=0, description="Ratio clip above: 1 + clip_high.")
    kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the k3 KL penalty to the frozen reference; 0 = no reference.",
    )
    reference_model: str = Field(
        default="", description="Directory of the frozen reference model; empty = model_path (the start)."
    )
    recompute_old_logprobs: bool = Field(
        default=False,
        description="Ignore the sampler's log probs and use the trainer's own as the ratio's denominator.",
    )
    lora: LoraSettings | None = Field(
        default=None,
        description="Train a LoRA adapter on the frozen model_path instead of the full weights; None = "
        "full weights. The KL reference is then the base model with the adapter switched off.",
    )
    seed: int = Field(default=0, description="Seed of torch's generators at start.")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads; 0 = torch's default.")


class TorchTrainer:
    """The policy, its optimizer and its step counter; `step(batch)` applies one GRPO update."""

    def __init__(
        self,
        config: TorchTrainerConfig,
        *,
        model_dir: str | Path | None = None,
        adapter_dir: str | Path | None = None,
    ) -> None:
        """Load the policy from `model_dir` (default: `config.model_path`), the reference if needed.

        With `config.lora`, the base model is wrapped in a fresh adapter, or in the one saved in
        `adapter_dir` (a resumed run), and only the adapter's parameters train.
        """
        self.config = config
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        # In a process group of several ranks (torchrun): each rank its share of every batch, FSDP2
        # or DDP over the ranks (keraunos.training.backends.torch.distributed).
        self.world = current_world()
        device = pick_device(config.device)
        if self.world is not None and device == "cuda":
            device = f"cuda:{self.world.local_rank}"
        self.device = torch.device(device)
        if config.bf16_autocast and self.device.type != "cuda":
            raise PolicyLoadError(
                f"bf16_autocast needs a CUDA device, not {self.device}: turn it off (CPU autocast is "
                "not used here: slower than float32 on most CPUs)"
            )
        self.model, self.tokenizer = load_policy(
            model_dir or config.model_path,
            device=self.device,
            dtype=config.dtype,
            attn_implementation=config.attn_implementation,
        )
        if config.lora is not None:
            self.model = _with_adapter(self.model, config.lora, adapter_dir)
        elif adapter_dir is not None:
            raise CheckpointError(
                f"{adapter_dir} holds a LoRA adapter, but this trainer's config has no lora"
            )
        self.reference: Any = None
        # LoRA without another reference model: the reference is the base, the adapter switched off.
        self._reference_is_base = config.lora is not None and not config.reference_model
        if config.kl_coef > 0 and not self._reference_is_base:
            self.reference, _ = load_policy(
                config.reference_model or config.model_path,
                device=self.device,
                dtype=config.dtype,
                attn_implementation=config.attn_implementation,
            )
            self.reference.requires_grad_(False)
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        # Full weights are sharded (FSDP2), a LoRA adapter is replicated (DDP: `self._replicated`
        # runs the trained forward passes, `self.model` stays the PEFT model for everything else).
        self._sharded = self.world is not None and config.lora is None
        self._replicated: Any = None
        if self._sharded:
            shard_model(self.model)  # before the optimizer: it must hold the sharded parameters
        elif self.world is not None:
            self._replicated = replicate_model(self.model, self.world, self.device)
        named = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        decay = [(name, p) for name, p in named if p.ndim >= 2]
        no_decay = [(name, p) for name, p in named if p.ndim < 2]
        # The optimizer's parameter order, by name, for checkpoints.
        self.parameter_names = [name for name, _ in decay + no_decay]
        self._parameters = [p for _, p in decay + no_decay]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for _, p in decay], "weight_decay": config.weight_decay},
                {"params": [p for _, p in no_decay], "weight_decay": 0.0},
            ],
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
        )
        self.global_step = 0

    @classmethod
    def resume(cls, path: str | Path, config: TorchTrainerConfig | None = None) -> TorchTrainer:
        """A trainer continuing from the checkpoint in `path`: its weights, optimizer state and step.

        `config` defaults to the checkpoint's own; a given one may change knobs (learning rate,
        clipping, micro-batch size) but the weights always come from the checkpoint.

        In a process group of several ranks every rank calls it with the same `path` (a collective
        when sharded): each loads the full weights (or the adapter) before it shards or replicates
        them, and the full optimizer state, of which FSDP2 keeps each rank's shard.
        """
        info = read_checkpoint(path)
        config = config or TorchTrainerConfig.model_validate(info.config)
        saved = info.path / MODEL_DIR
        if (config.lora is not None) != info.adapter:
            raise CheckpointError(
                f"{path} holds {'a LoRA adapter' if info.adapter else 'full weights'}, but the config "
                f"{'trains a LoRA adapter' if config.lora is not None else 'trains full weights'}: "
                "resume with the run's own lora settings"
            )
        trainer = cls(config, adapter_dir=saved) if info.adapter else cls(config, model_dir=saved)
        if trainer._sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            saved_optimizer = read_optimizer_state(info.path, trainer.parameter_names)
            # A checkpoint from before the first update has no state; set_optimizer_state_dict would
            # create one by a zero-gradient step (AdamW's step count 1), which one process does not.
            if saved_optimizer["state"]:
                set_optimizer_state_dict(
                    trainer.model,
                    trainer.optimizer,
                    cast(Any, saved_optimizer),
                    options=StateDictOptions(full_state_dict=True),
                )
        else:
            load_optimizer_state(info.path, trainer.optimizer, trainer.parameter_names)
        load_rng_state(info.path)
        trainer.global_step = info.step
        log.info("trainer resumed", checkpoint=str(info.path), step=info.step)
        return trainer

    def learning_rate(self, step: int | None = None) -> float:
        """The learning rate of update number `step` (default: the next one), warm-up included."""
        step = self.global_step if step is None else step
        if self.config.warmup_steps <= 0:
            return self.config.lr
        return self.config.lr * min(1.0, (step + 1) / self.config.warmup_steps)

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """Apply one GRPO update over `batch`; returns the step's metrics (timings in seconds)."""
        started = time.perf_counter()
        self._set_hyperparameters()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.accumulate_gradients(batch)

        t0 = time.perf_counter()
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._parameters, limit))
        skipped = not math.isfinite(grad_norm)
        if skipped:
            log.warning(
                "update skipped: the gradient is not finite", step=self.global_step, grad_norm=grad_norm
            )
        else:
            self.optimizer.step()
            self.global_step += 1
        self.optimizer.zero_grad(set_to_none=True)

        metrics.update(
            {
                "step": float(self.global_step),
                "grad_norm": grad_norm,
                "lr": self.learning_rate(self.global_step - (0 if skipped else 1)),
                "update_skipped": float(skipped),
                "time_optimizer": time.perf_counter() - t0,
                "time_step": time.perf_counter() - started,
            }
        )
        log.debug("trainer step", **metrics)
        return metrics

    def accumulate_gradients(self, batch: TrainBatch) -> dict[str, float]:
        """Add the batch's loss gradient to the parameters' `.grad`, micro-batch by micro-batch.

        No update: `step` calls this between `zero_grad` and the optimizer. Returns the loss
        metrics, the recorded-vs-recomputed log-prob gaps, counts and the forward/backward time.
        """
        batch.validate()
        sums = LossSums()
        diff = _Diff()
        started = time.perf_counter()
        size = self.config.micro_batch_size
        if self.world is None:
            micros, pads, scale = batch.by_span().micro_batches(size, self.config.micro_batch_tokens), 0, 1.0
        else:
            shard = shard_rows(batch, self.world)
            micros = shard.micro_batches(size, self.config.micro_batch_tokens) if len(shard) else []
            # Every rank runs as many passes as the busiest one (FSDP2's gathers and DDP's
            # all-reduce are collective); both average the gradients over ranks, the shards'
            # gradients must add up.
            pads, scale = most(len(micros)) - len(micros), float(self.world.size)
        passes = len(micros) + pads
        for i in range(passes):
            real = i < len(micros)
            micro = (micros[i] if real else padding_batch(batch)).trimmed()
            # DDP all-reduces once, in the last backward pass, the gradients accumulated by all.
            with self._no_sync(last=i == passes - 1):
                loss, micro_sums = self._micro_loss(micro, diff if real else _Diff())
                (loss * scale).backward()
            if real:
                sums = sums + micro_sums
        if self.world is not None:
            sums, (diff.total, diff.max, diff.tokens) = reduce_sums(sums, (diff.total, diff.max, diff.tokens))
        metrics = sums.metrics()
        metrics.update(diff.metrics())
        trained = batch.response_mask
        metrics.update(
            {
                "rows": float(len(batch)),
                "rollouts": float(len(np.unique(batch.rollout_index[trained.any(axis=1)]))),
                "advantage_token_mean": float(batch.advantages[trained].mean(dtype=np.float64))
                if trained.any()
                else 0.0,
                "time_forward_backward": time.perf_counter() - started,
            }
        )
        return metrics

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch) -> np.ndarray:
        """The policy's log probs (N, R) of the batch's response ids (float32, 0 off the mask)."""
        batch.validate()
        out = np.zeros(batch.response_mask.shape, dtype=np.float32)
        start = 0
        for micro in batch.micro_batches(self.config.micro_batch_size):
            micro = micro.trimmed()
            tensors = self._tensors(micro)
            logprobs, _ = response_logprobs(
                self.model,
                tensors["input_ids"],
                tensors["attention_mask"],
                tensors["position_ids"],
                micro.prompt_len,
                tensors["temperatures"],
            )
            values = np.where(micro.response_mask, logprobs.cpu().numpy(), 0.0)
            out[start : start + len(micro), : values.shape[1]] = values
            start += len(micro)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's current weights by name (live tensors: copy them, e.g. `load_state_dict`).

        Sharded over several ranks: the full weights gathered on rank 0's CPU (a collective: every
        rank calls it; the others get an empty dict). Replicated (LoRA): every rank's own, the same.
        """
        if self._sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=options))
        return {name: tensor.detach() for name, tensor in self.model.state_dict().items()}

    def save_model(self, path: str | Path) -> Path:
        """Write the current policy as a Hugging Face model directory (safetensors, config, tokenizer).

        What an out-of-process model server loads (`POST /keraunos/weights` with this path), or
        the final model of a run. Unlike a checkpoint it holds no optimizer state. A LoRA trainer
        writes a copy of its model with the adapter merged into the base weights (the adapter
        alone: `save_adapter`).
        """
        path = Path(path)
        model = copy.deepcopy(self.model).merge_and_unload() if self.config.lora is not None else self.model
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path

    def save_adapter(self, path: str | Path) -> Path:
        """Write the LoRA adapter as PEFT saves it (adapter_config.json, adapter_model.safetensors).

        What vLLM's `POST /v1/load_lora_adapter` and `keraunos serve`'s `POST /keraunos/adapters`
        load onto the base model: a few megabytes where the full weights are gigabytes.
        """
        if self.config.lora is None:
            raise CheckpointError(f"cannot write an adapter to {path}: this trainer trains full weights")
        path = Path(path)
        self.model.save_pretrained(path)
        return path

    def save_checkpoint(self, path: str | Path, *, run_state: dict[str, Any] | None = None) -> Path:
        """Write weights, tokenizer, optimizer state, step and config (and the training loop's
        `run_state`, when given) to the new directory `path`.

        Over several ranks every rank calls it; rank 0 writes the same checkpoint one process
        would, the others write nothing and return `path`. Sharded, it is a collective: the full
        weights and optimizer state are first gathered on rank 0's CPU. Replicated (LoRA), rank 0's
        adapter and optimizer state are every rank's.
        """
        full_state: tuple[dict[str, Any], dict[str, Any]] | None = None
        if self._sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            if self.optimizer.state:
                full_state = cast(
                    tuple[dict[str, Any], dict[str, Any]],
                    get_state_dict(self.model, self.optimizer, options=options),
                )
            else:
                # Before the first update: get_state_dict would create AdamW's state by a
                # zero-gradient step (step count 1), which the next update would then build on.
                groups = self.optimizer.state_dict()["param_groups"]
                by_name = [dict(g, params=[self.parameter_names[i] for i in g["params"]]) for g in groups]
                full_state = (
                    cast(dict[str, Any], get_model_state_dict(self.model, options=options)),
                    {"state": {}, "param_groups": by_name},
                )
        if self.world is not None and not self.world.is_main:
            return Path(path)
        written = save_checkpoint(
            path,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            parameter_names=self.parameter_names,
            step=self.global_step,
            config=self.config.model_dump(mode="json"),
            run_state=run_state,
            full_state=full_state,
        )
        log.info("checkpoint saved", path=str(written), step=self.global_step)
        return written

    def _micro_loss(self, micro: TrainBatch, diff: _Diff) -> tuple[torch.Tensor, LossSums]:
        tensors = self._tensors(micro)
        inputs = (tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], micro.prompt_len)
        ref_logprobs = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logprobs, _ = response_logprobs(self.reference, *inputs, tensors["temperatures"])
        elif self._reference_is_base and self.config.kl_coef > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref_logprobs, _ = response_logprobs(self.model, *inputs, tensors["temperatures"])
        policy = self._replicated if self._replicated is not None else self.model
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.config.bf16_autocast):
            logprobs, entropy = response_logprobs(policy, *inputs, tensors["temperatures"], with_entropy=True)
        logprobs, entropy = logprobs.float(), entropy.float() if entropy is not None else None
        mask = tensors["response_mask"]
        recorded = tensors["logprobs_valid"][:, None] & mask
        diff.add(logprobs.detach(), tensors["old_logprobs"], recorded)
        use_recorded = recorded if not self.config.recompute_old_logprobs else torch.zeros_like(recorded)
        old = torch.where(use_recorded, tensors["old_logprobs"], logprobs.detach())
        return policy_loss(
            logprobs,
            old,
            tensors["advantages"],
            tensors["loss_weights"],
            mask,
            clip_low=self.config.clip_low,
            clip_high=self.config.clip_high,
            ref_logprobs=ref_logprobs,
            kl_coef=self.config.kl_coef,
            entropy=entropy,
        )

    def _no_sync(self, *, last: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP's `no_sync` for every pass but the last (gradients accumulate locally until then)."""
        if self._replicated is None or last:
            return contextlib.nullcontext()
        return self._replicated.no_sync()

    def _tensors(self, batch: TrainBatch) -> dict[str, torch.Tensor]:
        device = self.device
        return {
            "input_ids": torch.from_numpy(batch.input_ids).to(device),
            "attention_mask": torch.from_numpy(batch.attention_mask).to(device),
            "position_ids": torch.from_numpy(batch.position_ids).to(device),
            "response_mask": torch.from_numpy(batch.response_mask).to(device),
            "advantages": torch.from_numpy(batch.advantages).to(device),
            "loss_weights": torch.from_numpy(batch.loss_weights).to(device),
            "old_logprobs": torch.from_numpy(batch.old_logprobs).to(device),
            "logprobs_valid": torch.from_numpy(batch.logprobs_valid).to(device),
            "temperatures": torch.from_numpy(batch.temperatures).to(device),
        }

    def _set_hyperparameters(self) -> None:
        """The config's knobs on every parameter group (a resumed optimizer keeps none of its own)."""
        lr = self.learning_rate()
        for group, decay in zip(self.optimizer.param_groups, (self.config.weight_decay, 0.0), strict=True):
            group.update(lr=lr, betas=self.config.betas, eps=self.config.eps, weight_decay=decay)


class _Diff:
    """Running |recorded - recomputed| log-prob statistics over tokens where both exist."""

    def __init__(self) -> None:
        self.total = 0.0
        self.max = 0.0
        self.tokens = 0.0

    def add(self, recomputed: torch.Tensor, recorded: torch.Tensor, where: torch.Tensor) -> None:
        gap = torch.where(where, (recomputed - recorded).abs(), torch.zeros_like(recomputed))
        self.total += float(gap.sum())
        self.max = max(self.max, float(gap.max()) if gap.numel() else 0.0)
        self.tokens += float(where.sum())

    def metrics(self) -> dict[str, float]:
        return {
            "logprob_diff_mean": self.total / self.tokens if self.tokens else 0.0,
            "logprob_diff_max": self.max,
            "recorded_logprob_tokens": self.tokens,
        }


def _with_adapter(model: Any, lora: LoraSettings, adapter_dir: str | Path | None) -> Any:
    """`model` wrapped by PEFT in a new LoRA adapter (B = 0: the policy starts as the base) or in
    the trainable adapter saved in `adapter_dir`; the base weights frozen, eval mode kept."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_dir is not None:
        wrapped: Any = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    else:
        settings = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=0.0,
            target_modules=list(lora.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            wrapped = get_peft_model(model, settings)
        except ValueError as error:  # no module of the model matches target_modules
            raise PolicyLoadError(f"cannot add a LoRA adapter: {error}") from error
    wrapped.eval()
    return wrapped

"""verl's sync V1 trainer with the gateway coupled around its weight syncs (`keraunos_sync`).

In verl's sync mode (`PPOTrainerSync`) the trainer syncs the actor's weights into its inference
servers at the end of every step (`on_step_end`, and once at start, `on_init_end`). keraunos's
gateway sits between the agents and those servers, so around each sync it does what `keraunos
train` does around a publish: pause the proxy and wait for the calls in flight (new calls get 429
with `Retry-After`, which agents retry), swap, re-register every server with the new version (the
version verl calls `global_steps`, recorded on every later call and read back as
`min_global_steps` / `max_global_steps`), resume. `GatewayCoupling` is that sequence, usable on
its own; `KeraunosSyncTrainer` calls it.

`KeraunosSyncTrainer` also makes verl's loss keraunos's per-rollout mean (`rollout_mean`): after
verl's advantage step it scales each rollout's stored advantages by `N / (R * T_r)`, and it trains
each step as one mini-batch, so that N, the step's trainable tokens, is the N verl's `token-mean`
divides by (verl cuts a step into mini-batches of `ppo_mini_batch_size x n` rows, and merge breaks
make a step longer than that).

verl looks trainers up by name in the process that runs its task runner (a Ray actor), so the
registration must happen there: `register()` is meant for Ray's `worker_process_setup_hook`
(`config.verl_overrides` sets it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import structlog
import torch
import transfer_queue as tq  # pyright: ignore[reportMissingImports]
from tensordict import TensorDict  # pyright: ignore[reportMissingImports]
from verl.trainer.ppo.v1.trainer_base import register_trainer  # pyright: ignore[reportMissingImports]
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # pyright: ignore[reportMissingImports]
from verl.workers.utils.padding import response_to_nested  # pyright: ignore[reportMissingImports]

from keraunos.training.backends.verl.config import TRAINER_MODE, KeraunosVerlConfig
from keraunos.training.backends.verl.rollout_mean import session_of, token_mean_scales
from keraunos.training.collect import CollectorConfig, DrainReport, RolloutCollector
from keraunos.training.registry import EndpointRegistry

log = structlog.get_logger("keraunos.training.backends.verl")


class GatewayCoupling:
    """Pause and drain the gateway before a weight swap; after it, register the servers at the new
    version and resume. Synchronous (verl's trainer hooks are), each step on a fresh event loop."""

    def __init__(self, config: KeraunosVerlConfig) -> None:
        if not config.served_model:
            raise ValueError("keraunos.served_model is needed to register verl's servers with the gateway")
        self.config = config

    def pause_and_drain(self) -> DrainReport:
        """Pause the proxy and wait up to `drain_timeout_s` for the calls in flight."""
        return asyncio.run(self._with_collector(lambda c: c.pause_and_drain(self.config.drain_timeout_s)))

    def publish(self, endpoints: Sequence[str], version: int) -> None:
        """Register every endpoint at `version`, then let calls through again."""
        asyncio.run(self._publish(list(endpoints), version))

    def resume(self) -> None:
        """Let calls through again (after a failed swap: the old registration stays)."""
        asyncio.run(self._with_collector(lambda c: c.resume()))

    def swap(self, endpoints: Callable[[], Sequence[str]], version: int, swap: Callable[[], None]) -> None:
        """The whole sequence around `swap()`; the proxy is resumed even when `swap` raises."""
        report = self.pause_and_drain()
        log.info("weight sync: gateway drained", version=version, inflight_left=report.inflight_at_timeout)
        try:
            swap()
        except BaseException:
            self.resume()
            raise
        self.publish(endpoints(), version)

    async def _publish(self, endpoints: list[str], version: int) -> None:
        registry = EndpointRegistry(self.config.server_url, self.config.key, self.config.served_model)
        try:
            await registry.register(endpoints, version, served_as=self.config.served_as or None)
        finally:
            await registry.close()
        await self._with_collector(lambda c: c.resume())

    async def _with_collector(self, action: Callable[[RolloutCollector], Any]) -> Any:
        config = CollectorConfig(
            server_url=self.config.server_url,
            key=self.config.key,
            run_id=self.config.run_id,
            request_timeout_s=self.config.request_timeout_s,
        )
        async with RolloutCollector(config) as collector:
            return await action(collector)


def server_endpoints(trainer: Any) -> list[str]:
    """The OpenAI-compatible base URLs of verl's inference servers (`http://{address}/v1`)."""
    return [f"http://{replica.server_address}/v1" for replica in trainer.llm_server_manager.get_replicas()]


def scale_advantages_to_rollout_mean(batch: Any) -> Any:
    """Scale the advantages TransferQueue holds for `batch` (a `KVBatchMeta`, a step the actor trains
    as one mini-batch) by `token_mean_scales`: verl's `token-mean` policy loss on them is keraunos's
    per-rollout mean."""
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages", "response_mask"]
    )
    nested_mask = data["response_mask"]
    padded = data.to_padded_tensor()
    scales = token_mean_scales(padded["response_mask"].numpy(), [session_of(k) for k in batch.keys])
    advantages = padded["advantages"] * torch.from_numpy(scales).to(padded["advantages"].dtype)
    fields = TensorDict({"advantages": response_to_nested(advantages, nested_mask)}, batch_size=len(batch))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)


@contextlib.contextmanager
def one_mini_batch(config: Any, rows: int) -> Iterator[None]:
    """Within the block, the actor's `ppo_mini_batch_size` (in samples: verl multiplies it by
    `rollout.n`) covers `rows` rows, so the actor trains them as one mini-batch, one optimizer step.
    verl's batch balancing has padded the step to a multiple of the configured mini-batch's rows
    and of the data-parallel size, so `rows` is a multiple of `n` and splits evenly over the ranks."""
    actor = config.actor_rollout_ref.actor
    configured = actor.ppo_mini_batch_size
    actor.ppo_mini_batch_size = max(configured, math.ceil(rows / config.actor_rollout_ref.rollout.n))
    try:
        yield
    finally:
        actor.ppo_mini_batch_size = configured


@register_trainer(TRAINER_MODE)
class KeraunosSyncTrainer(PPOTrainerSync):
    """`PPOTrainerSync` whose weight syncs are wrapped by `GatewayCoupling` (the run's `keraunos:`
    config section), whose advantages are scaled to keraunos's per-rollout loss mean, and whose
    actor trains each step as one mini-batch (the module docstring says why)."""

    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        return scale_advantages_to_rollout_mean(super()._compute_advantage(batch, metrics))

    def _update_actor(self, batch: Any, metrics: dict[str, Any]) -> Any:
        with one_mini_batch(self.config, len(batch)):
            return super()._update_actor(batch, metrics)

    def _coupling(self) -> GatewayCoupling:
        from omegaconf import OmegaConf  # pyright: ignore[reportMissingImports]

        section = OmegaConf.to_container(self.config.keraunos, resolve=True)
        return GatewayCoupling(KeraunosVerlConfig.model_validate(section))

    def on_init_end(self) -> None:
        self._coupling().swap(lambda: server_endpoints(self), self.global_steps, super().on_init_end)

    def on_step_end(self) -> None:
        self._coupling().swap(lambda: server_endpoints(self), self.global_steps, super().on_step_end)


def register() -> None:
    """Nothing to do: importing this module registered `keraunos_sync` and the `keraunos` agent
    loop. Named for Ray's `worker_process_setup_hook`."""
    from keraunos.training.backends.verl import agent_loop  # noqa: F401

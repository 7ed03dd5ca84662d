"""verl's sync V1 trainer with the gateway coupled around its weight syncs (`keraunos_sync`).

In verl's sync mode (`PPOTrainerSync`) the trainer syncs the actor's weights into its inference
servers at the end of every step (`on_step_end`, and once at start, `on_init_end`). keraunos's
gateway sits between the agents and those servers, so around each sync it does what `keraunos
train` does around a publish: pause the proxy and wait for the calls in flight (new calls get 429
with `Retry-After`, which agents retry), swap, re-register every server with the new version (the
version verl calls `global_steps`, recorded on every later call and read back as
`min_global_steps` / `max_global_steps`), resume. `GatewayCoupling` is that sequence, usable on
its own; `KeraunosSyncTrainer` calls it.

verl looks trainers up by name in the process that runs its task runner (a Ray actor), so the
registration must happen there: `register()` is meant for Ray's `worker_process_setup_hook`
(`config.verl_overrides` sets it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from verl.trainer.ppo.v1.trainer_base import register_trainer  # pyright: ignore[reportMissingImports]
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # pyright: ignore[reportMissingImports]

from keraunos.training.backends.verl.config import TRAINER_MODE, KeraunosVerlConfig
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


@register_trainer(TRAINER_MODE)
class KeraunosSyncTrainer(PPOTrainerSync):
    """`PPOTrainerSync` whose weight syncs are wrapped by `GatewayCoupling` (the run's `keraunos:`
    config section)."""

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

"""The proxy's per-app state (on `app.state.proxy`) and its lifespan: HTTP client, pause, drain.

Nothing here is a module global, so two gateways can run in one process. The pause itself belongs
to the app's `Coordination` (`keraunos.gateway.replicas`): in memory for one gateway, shared
through PostgreSQL by replicas of one ledger; `ProxyState.pause` is its admission state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import structlog

from keraunos.gateway._redaction import GatewayRedaction
from keraunos.gateway.config import GatewayConfig
from keraunos.gateway.metrics import GatewayMetrics
from keraunos.gateway.proxy.cache import EndpointCache, KnownRollouts, Replays
from keraunos.gateway.proxy.disconnect import WatchScheduler
from keraunos.gateway.proxy.exact_tokens import ExactTokens
from keraunos.gateway.proxy.pins import RolloutPins
from keraunos.gateway.proxy.routing import Cooldowns
from keraunos.gateway.proxy.upstream import RetryPolicy
from keraunos.gateway.replicas import Coordination, LocalCoordination, Pause
from keraunos.ledger.base import Ledger

__all__ = ["Pause", "ProxyState", "proxy_lifespan"]

log = structlog.get_logger("keraunos.gateway.proxy")


class ProxyState:
    """Everything the proxy routes share: config, caches, endpoint health, pause, metrics, the HTTP client.

    Endpoint health (`cooldowns`) is this process's own: each replica learns an endpoint failed from
    its own calls (see docs/scale-out.md).
    """

    def __init__(
        self,
        config: GatewayConfig,
        ledger: Ledger,
        metrics: GatewayMetrics | None = None,
        coordination: Coordination | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.endpoints = EndpointCache(ledger, config.models_refresh_s)
        self.rollouts = KnownRollouts()
        self.pins = RolloutPins(ledger, config.models_refresh_s)
        self.replays = Replays(ledger)
        self.cooldowns = Cooldowns()
        self.coordination = coordination if coordination is not None else LocalCoordination()
        self.pause: Pause = self.coordination.pause
        self.watches = WatchScheduler(config.proxy_disconnect_watch_after_s)
        self.metrics.watch_inflight(lambda: self.pause.inflight)
        self.policy = RetryPolicy(
            max_attempts=config.proxy_max_attempts,
            backoff_initial_s=config.proxy_backoff_initial_s,
            backoff_max_s=config.proxy_backoff_max_s,
            cooldown_s=config.endpoint_cooldown_s,
        )
        self.temperatures = {"train": config.train_temperature, "val": config.val_temperature}
        #: --side-call-models: what a harness's side calls ask for (docs/harnesses.md#side-calls).
        self.side_call_models = tuple(p.strip() for p in config.side_call_models.split(",") if p.strip())
        # --exact-tokens: None when off, so a call pays one attribute test for the option.
        self.exact: ExactTokens | None = (
            ExactTokens(config.exact_tokens_memory_ids, self.metrics) if config.exact_tokens else None
        )
        self.created = int(time.time())
        # --redaction-policy: applied to each call's record before commit (set by `create_app`)
        self.redaction: GatewayRedaction | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The one HTTP client session for every upstream call (opened by the lifespan, or on first use)."""
        if self._session is None:
            self._session = _new_session(self.config)
        return self._session

    async def aclose(self) -> None:
        self.watches.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def drain(self, seconds: float) -> bool:
        """Wait until no admitted proxy call is running, at most `seconds`; True if none is."""
        pause = self.pause
        if pause.inflight == 0:
            return True
        pause.idle = asyncio.Event()
        try:
            async with asyncio.timeout(seconds):
                await pause.idle.wait()
        except TimeoutError:
            return False
        finally:
            pause.idle = None
        return True


#: Idle upstream connections are closed after this many seconds: below the 5 s keep-alive of
#: uvicorn-based engines (vLLM), so the gateway never sends on a connection the server is closing.
_KEEPALIVE_S = 4.0


def _new_session(config: GatewayConfig) -> aiohttp.ClientSession:
    # aiohttp rather than httpx: measured ~0.2 ms of CPU per proxied call against ~1 ms.
    timeout = config.proxy_upstream_timeout_s
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=config.proxy_max_connections, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
        ),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 10.0), sock_read=timeout),
        # Model endpoints are configured by the operator; the environment's proxies do not apply.
        trust_env=False,
    )


@asynccontextmanager
async def proxy_lifespan(state: ProxyState) -> AsyncIterator[None]:
    """Join the replicas (if any) and open the HTTP client session; on shutdown let in-flight calls
    finish (bounded), close the session, then leave the replicas."""
    async with state.coordination.running():
        _ = state.session
        try:
            yield
        finally:
            if not await state.drain(state.config.drain_timeout_s):
                log.warning(
                    "shutting down with proxy calls still running",
                    inflight=state.pause.inflight,
                    drain_timeout_s=state.config.drain_timeout_s,
                )
            await state.aclose()

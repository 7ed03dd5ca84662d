"""`KeraunosAgentLoop`: verl's agent loop for one session, run as a keraunos rollout on the gateway.

verl calls an agent loop's `run(sampling_params, **sample)` once per session (`rollout.n` per
dataset sample). This one does not talk to verl's servers itself: it creates the keraunos rollout
`{run_id}.{uid}.{session_id}` (group `{run_id}.{uid}`, input from the sample: `rollout_input`) on the
gateway, lets keraunos's controller run the real agent against the gateway (whose model endpoints
are verl's inference servers, `trainer.py`), waits until the rollout is terminal, reads its calls
(the compact triplet view), builds its rows with keraunos's exact-prefix merge, and returns one
`AgentLoopOutput` per row (several when the merge broke) with the recorded log probs, the reward
and the policy versions that served the calls (`batch.agent_loop_outputs`).

Registered as `keraunos` (`config.AGENT_LOOP_NAME`); the `keraunos:` section of the run's config
(`KeraunosVerlConfig`) says where the gateway is. A creation is idempotent (the rollout id is
fixed by the sample and session), so a retried request never makes a second rollout.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import httpx
import structlog
from verl.experimental.agent_loop.agent_loop import (  # pyright: ignore[reportMissingImports]
    AgentLoopBase,
    register,
)

from keraunos.training._data import CompletedRollout
from keraunos.training._outcome import SiblingOutcome, settle_group
from keraunos.training._read import TripletReadError, read_events_json
from keraunos.training.backends.verl.batch import agent_loop_outputs
from keraunos.training.backends.verl.config import AGENT_LOOP_NAME, KeraunosVerlConfig
from keraunos.training.collect import TERMINAL
from keraunos.training.errors import TrainError
from keraunos.training.trajectories import Tokenizer, TrajectoryConfig, build_rows

log = structlog.get_logger("keraunos.training.backends.verl")


def rollout_ids(config: KeraunosVerlConfig, uid: str, session_id: int) -> tuple[str, str]:
    """(group id, rollout id) of a verl session: one keraunos group per verl sample."""
    group_id = f"{config.run_id}.{uid}"
    return group_id, f"{group_id}.{session_id}"


async def run_rollout(
    api: httpx.AsyncClient,
    config: KeraunosVerlConfig,
    group_id: str,
    rollout_id: str,
    sample: Mapping[str, Any],
) -> CompletedRollout | None:
    """Create the rollout (or find it), wait until it is terminal, read it; None when it yields
    nothing to train on (failed, timed out, no successful call), as the collector decides."""
    item = {
        "rollout_id": rollout_id,
        "input": config.rollout_input(sample),
        "is_train": config.is_train,
        "metadata": {"data_id": group_id},
    }
    created = await _request(api, "POST", "/api/rollouts", ok=201, json=[item])
    deadline = time.monotonic() + config.rollout_timeout_s
    state = created.json()[0].get("status", {}).get("state")
    while state not in TERMINAL:
        if time.monotonic() > deadline:
            log.warning("rollout timed out: no rows", rollout_id=rollout_id, state=state)
            return None
        await asyncio.sleep(config.poll_interval_s)
        response = await _request(api, "GET", f"/api/rollouts/{rollout_id}")
        state = response.json()["rollout"]["status"]["state"]
    params = {"format": "triplet", "delta": "1"}
    events = await _request(api, "GET", f"/api/rollouts/{rollout_id}/events", params=params)
    try:
        read = read_events_json(events.content)
    except TripletReadError as exc:
        log.error("rollout events unreadable", rollout_id=rollout_id, error=str(exc))
        read = None
    counts: Counter[str] = Counter()
    kept = settle_group(
        group_id,
        [SiblingOutcome(rollout_id, state, read)],
        failed_rollouts="drop",
        fill_reward=config.fill_reward,
        min_group_size=1,  # verl forms the group: GRPO runs over the sample's sessions
        counts=counts,
    )
    if not kept:
        log.info("rollout yields no rows", rollout_id=rollout_id, state=state, **counts)
        return None
    return kept[0]


async def _request(
    api: httpx.AsyncClient, method: str, url: str, *, ok: int = 200, retries: int = 5, **kwargs: Any
) -> httpx.Response:
    """One request, retried with doubling backoff on transport errors, 429 and 5xx: every request
    here is idempotent (the rollout id is fixed, so a repeated creation finds the rollout)."""
    delay = 0.5
    for attempt in range(retries + 1):
        try:
            response = await api.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            if attempt == retries:
                raise TrainError(f"{method} {url}: {exc!r} after {attempt + 1} tries") from exc
        else:
            if response.status_code == ok:
                return response
            if (response.status_code != 429 and response.status_code < 500) or attempt == retries:
                raise TrainError(f"{method} {url}: HTTP {response.status_code}: {response.text[:300]}")
        await asyncio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def session_outputs(
    rollout: CompletedRollout | None, config: TrajectoryConfig, tokenizer: Tokenizer | None
) -> list[Any]:
    """The rows of one rollout as verl `AgentLoopOutput`s, in order (empty: nothing to train)."""
    if rollout is None:
        return []
    built = build_rows([rollout], config, tokenizer)
    if built.breaks:
        log.info(
            "merge breaks", rollout_id=rollout.rollout_id, rows=len(built.rows), breaks=len(built.breaks)
        )
    outputs = agent_loop_outputs(built.rows, [rollout])
    # verl's ratio (bypass mode) needs the sampler's log probs on every row of a batch; a row whose
    # calls did not all record them cannot train there, and one without them breaks the batch.
    kept = [output for output in outputs if output.response_logprobs is not None]
    if len(kept) < len(outputs):
        log.warning(
            "rows without recorded log probs left out",
            rollout_id=rollout.rollout_id,
            rows=len(outputs),
            left_out=len(outputs) - len(kept),
        )
    return kept


@register(AGENT_LOOP_NAME)
class KeraunosAgentLoop(AgentLoopBase):
    """One verl session = one keraunos rollout; returns its rows (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keraunos = KeraunosVerlConfig.model_validate(_plain(self.config.get("keraunos")))
        # verl annotates it as `AutoTokenizer`; it is the model's loaded tokenizer.
        self.hf_tokenizer: Any = self.tokenizer
        pad = self.hf_tokenizer.pad_token_id
        self.trajectory = TrajectoryConfig(
            max_prompt_len=int(self.rollout_config.prompt_length),
            max_response_len=int(self.rollout_config.response_length),
            pad_token_id=int(pad) if pad is not None else 0,
        )

    # verl's base annotates one output; its V1 worker (`AgentLoopWorkerTQ`) takes a list as well.
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """The rows of the rollout made for this session (`sampling_params` are the agent's
        business: it calls the gateway with its own)."""
        group_id, rollout_id = rollout_ids(
            self.keraunos, str(kwargs["uid"]), int(kwargs.get("session_id", 0))
        )
        headers = {"Authorization": f"Bearer {self.keraunos.key}"} if self.keraunos.key else {}
        async with httpx.AsyncClient(
            base_url=self.keraunos.server_url, headers=headers, timeout=self.keraunos.request_timeout_s
        ) as api:
            rollout = await run_rollout(api, self.keraunos, group_id, rollout_id, kwargs)
        return session_outputs(rollout, self.trajectory, self.hf_tokenizer)


def _plain(value: Any) -> Any:
    """An OmegaConf node (verl's config) as plain Python values; anything else as it is."""
    if hasattr(value, "_get_node"):
        from omegaconf import OmegaConf  # pyright: ignore[reportMissingImports]

        return OmegaConf.to_container(value, resolve=True)
    return value

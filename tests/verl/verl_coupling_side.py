"""The verl side of test_verl_coupling.py: run by `.venv-verl`'s python, it calls verl's own sync
step end (`PPOTrainerSync.on_step_end`, through `KeraunosSyncTrainer`) with a stand-in for verl's
checkpoint manager and server replicas (a real swap needs GPUs), and records what the gateway
looked like while the weights were being swapped. Prints one JSON object.

Input (stdin, JSON): `server_url`, `key`, `served_model`, `server_address` (host:port of the
engine, which plays verl's inference server), `proxy_call` (a chat completions URL path), `version`.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import httpx
from omegaconf import OmegaConf

from keraunos.training.backends.verl.trainer import KeraunosSyncTrainer


def main() -> None:
    spec = json.load(sys.stdin)
    headers = {"Authorization": f"Bearer {spec['key']}"}
    seen: dict[str, Any] = {}

    def update_weights(version: int) -> None:
        """verl's weight sync, as the gateway sees it: the state, and a call made meanwhile."""
        with httpx.Client(base_url=spec["server_url"], headers=headers, timeout=30) as api:
            seen["version"] = version
            seen["state"] = api.get("/proxy/state").json()
            call = api.post(spec["proxy_call"], json={"messages": [{"role": "user", "content": "hi"}]})
            seen["call_during_swap"] = call.status_code

    trainer = KeraunosSyncTrainer.__new__(KeraunosSyncTrainer)  # verl's __init__ starts its workers
    trainer.config = OmegaConf.create(
        {"keraunos": {k: spec[k] for k in ("server_url", "key", "served_model")} | {"drain_timeout_s": 60}}
    )
    trainer.global_steps = spec["version"]
    trainer.timing_raw = {}
    trainer.checkpoint_manager = SimpleNamespace(update_weights=update_weights)
    replica = SimpleNamespace(server_address=spec["server_address"])
    trainer.llm_server_manager = SimpleNamespace(get_replicas=lambda: [replica])
    trainer.on_step_end()
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()

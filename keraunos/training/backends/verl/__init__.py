"""The verl backend: keraunos rollouts trained by verl 0.9's V1 trainer (Ray, FSDP/Megatron, vLLM/SGLang).

verl lives in a venv of its own (`.venv-verl`, docs/trainer.md "verl"); nothing else in keraunos
imports this package. `batch` turns keraunos rows into verl's agent-loop outputs and training batch,
`agent_loop` is the agent loop verl runs per session (one keraunos rollout each), `trainer` couples
the gateway to verl's weight syncs, `rollout_mean` scales advantages so that verl's `token-mean`
loss is keraunos's per-rollout mean, `config` holds the `keraunos:` section and the verl settings
that make verl's update keraunos's.
"""

from __future__ import annotations

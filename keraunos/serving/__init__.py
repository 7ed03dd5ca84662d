"""The built-in OpenAI-compatible model server for small policies (`keraunos serve`).

It serves a Hugging Face `transformers` causal LM from a local directory with vLLM's extras
(`return_token_ids`, log probabilities of the sampled distribution), batches concurrent requests,
reuses the exact token ids of its own replies when they come back in a later prompt, and swaps its
weights in place. See docs/serving.md.

    server = ModelServer.from_config(ServeConfig(model="DIR"))
    running = server.start()                  # uvicorn in a background thread
    ...                                       # register running.endpoint with a gateway
    server.load_weights(model.state_dict())   # version + 1

The names below are imported on first use, so `keraunos.serving.config` and `.tiny` can be
imported without loading torch (the `keraunos serve` command checks its options first).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keraunos.serving.config import ServeConfig
    from keraunos.serving.runner import ModelLoadError, ModelRunner, WeightsError
    from keraunos.serving.server import ModelServer, RunningServer, serve
    from keraunos.serving.tiny import build_tiny_model

_WHERE = {
    "ServeConfig": "keraunos.serving.config",
    "ModelLoadError": "keraunos.serving.runner",
    "ModelRunner": "keraunos.serving.runner",
    "WeightsError": "keraunos.serving.runner",
    "ModelServer": "keraunos.serving.server",
    "RunningServer": "keraunos.serving.server",
    "serve": "keraunos.serving.server",
    "build_tiny_model": "keraunos.serving.tiny",
}

__all__ = [
    "ModelLoadError",
    "ModelRunner",
    "ModelServer",
    "RunningServer",
    "ServeConfig",
    "WeightsError",
    "build_tiny_model",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'keraunos.serving' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""Fixtures of the vLLM tests: one real vLLM (CPU build) serving SmolLM2-135M-Instruct for the whole
run, and a real keraunos gateway in front of it.

The model is converted once per run by `keraunos convert-gguf`, vLLM is started from `.venv-vllm`
on a free loopback port and stopped at the end. Without that venv or the model's packages the
tests skip and say why; with `CI=true` they fail instead (`.ci/run` installs both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from vllm_support import SERVED, VllmServer, convert_smollm2, require_model_packages, require_vllm, start_vllm

from keraunos.testing.processes import Gateway


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM serving SmolLM2-135M-Instruct (float32, eager) as `SERVED`, for the whole run."""
    python = require_vllm()
    require_model_packages()
    workdir = tmp_path_factory.mktemp("vllm")
    model_dir = convert_smollm2(workdir / "smollm2")
    server = start_vllm(python, model_dir, workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_gateway(session_gateway_factory: Callable[..., Gateway], vllm_server: VllmServer) -> Gateway:
    """A keraunos gateway whose served model is vLLM's (train temperature 1.0, its default)."""
    gateway = session_gateway_factory(args=("--served-model", SERVED, "--proxy-upstream-timeout-s", "120"))
    with gateway.client() as api:
        endpoint = {"model": SERVED, "endpoint": vllm_server.endpoint, "version": 0}
        response = api.post("/api/models", json=[endpoint])
    assert response.status_code == 201, response.text
    return gateway


@pytest.fixture(scope="session")
def smollm2_tokenizer(vllm_server: VllmServer) -> Any:
    """The converted model's tokenizer, for decoding the texts of merge breaks."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(vllm_server.model_dir))

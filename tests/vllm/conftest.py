"""Fixtures of the vLLM tests: one real vLLM (CPU build) serving SmolLM2-135M-Instruct for the whole
run, and a real keraunos gateway in front of it.

The model is converted once per run by `keraunos convert-gguf`, vLLM is started from `.venv-vllm`
on a free loopback port and stopped at the end. Without that venv or the model's packages the
tests skip and say why; with `CI=true` they fail instead (`.ci/run` installs both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_support import (
    LORA_ARGS,
    SERVED,
    VllmServer,
    convert_smollm2,
    require_model_packages,
    require_vllm,
    start_vllm,
)

from keraunos.testing.processes import Gateway


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted to a float32 Hugging Face directory, once per run."""
    require_vllm()
    require_model_packages()
    return convert_smollm2(tmp_path_factory.mktemp("smollm2") / "smollm2")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[VllmServer]:
    """vLLM serving SmolLM2-135M-Instruct (float32, eager) as `SERVED`, for the whole run.

    Runtime LoRA loading is on (adapters of rank <= 8, two at once) for test_vllm_lora.py: a
    request naming the base model is served by the base as without it, and a second vLLM would
    cost its start-up again.
    """
    server = start_vllm(
        require_vllm(),
        smollm2_dir,
        tmp_path_factory.mktemp("vllm"),
        extra_args=LORA_ARGS,
        extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )
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
def vllm_exact_gateway(session_gateway_factory: Callable[..., Gateway], vllm_server: VllmServer) -> Gateway:
    """A second gateway in front of the same vLLM, with `--exact-tokens` (test_vllm_exact_tokens.py)."""
    gateway = session_gateway_factory(
        args=("--served-model", SERVED, "--proxy-upstream-timeout-s", "120", "--exact-tokens", "true")
    )
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

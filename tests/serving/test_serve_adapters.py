"""`keraunos serve` with LoRA adapters: `POST /keraunos/adapters` loads a PEFT adapter onto the base
model, a request naming the adapter is generated with it, the base name still gets the base."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import torch

KEY = "adapter-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0, "logprobs": 0}


def make_adapter(base: Path, path: Path, seed: int) -> Path:
    """A PEFT LoRA adapter of `base` with random (non-zero) matrices, saved in `path`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    peft_model.save_pretrained(str(path))
    return path


def complete(base_url: str, model: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", json={**GREEDY, "model": model}, headers=AUTH, timeout=60)


def logprobs_of(response: httpx.Response) -> list[float]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def test_a_loaded_adapter_serves_the_requests_that_name_it_while_the_base_name_keeps_the_base(
    tiny_dir: Path, tmp_path: Path, serve_process: Any
) -> None:
    served = serve_process("--model", str(tiny_dir), "--served-model-name", "base", "--api-key", KEY)
    url = served.base_url
    adapter = make_adapter(tiny_dir, tmp_path / "a1", seed=1)
    before = logprobs_of(complete(url, "base"))

    body = {"name": "base-v1", "path": str(adapter)}
    assert httpx.post(f"{url}/keraunos/adapters", json=body, timeout=60).status_code == 401
    loaded = httpx.post(f"{url}/keraunos/adapters", json=body, headers=AUTH, timeout=60)
    assert loaded.status_code == 200 and loaded.json()["adapters"] == ["base-v1"]

    with_adapter = complete(url, "base-v1")
    assert with_adapter.json()["model"] == "base-v1"
    assert max(abs(a - b) for a, b in zip(logprobs_of(with_adapter), before, strict=False)) > 1e-3
    assert logprobs_of(complete(url, "base")) == before
    models = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("base", None), ("base-v1", "base")]
    assert [a["name"] for a in httpx.get(f"{url}/keraunos/info", headers=AUTH).json()["adapters"]] == [
        "base-v1"
    ]


def test_adapter_loads_that_cannot_work_are_refused_with_what_is_wrong_and_old_ones_are_unloaded(
    tiny_dir: Path, tmp_path: Path, serve_process: Any
) -> None:
    served = serve_process("--model", str(tiny_dir), "--served-model-name", "base", "--max-adapters", "2")
    url = served.base_url

    def load(name: str, path: Path) -> httpx.Response:
        return httpx.post(f"{url}/keraunos/adapters", json={"name": name, "path": str(path)}, timeout=60)

    nothing = load("x", tmp_path / "missing")
    assert nothing.status_code == 400 and "no PEFT adapter" in nothing.json()["error"]["message"]
    adapter = make_adapter(tiny_dir, tmp_path / "a", seed=2)
    own_name = load("base", adapter)
    assert own_name.status_code == 400 and "serves the base model" in own_name.json()["error"]["message"]
    assert httpx.post(f"{url}/keraunos/adapters", json={"name": 3}, timeout=10).status_code == 400

    for version in (1, 2, 3):
        assert load(f"base-v{version}", adapter).status_code == 200
    # At most two stay loaded: the oldest went, and its name is unknown again, as any other.
    assert complete(url, "base-v1").status_code == 404
    assert complete(url, "base-v3").status_code == 200
    swap = httpx.post(f"{url}/keraunos/weights", json={"path": str(tiny_dir)}, timeout=60)
    assert swap.status_code == 400 and "adapters are loaded" in swap.json()["error"]["message"]

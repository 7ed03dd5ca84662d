"""Codex CLI (`@openai/codex`, pinned in harness_support) through the gateway's Responses route, as a
user points it at a rollout: a custom model provider in `$CODEX_HOME/config.toml` whose `base_url`
is the attempt's `.../mode/train/openai/v1` (it appends `/responses`), `wire_api = "responses"`,
and the attempt's agent token in the environment variable its `env_key` names (sent as
`Authorization: Bearer`); analytics and OpenTelemetry export off; `codex exec` non-interactive.

The engine stand-in's script makes the model call one of Codex's tools to write a file of the temp
directory (`exec_command`, a function tool; or `apply_patch`, a `custom` freeform tool Codex offers
models of its own catalog), then answer in text once the tool's output comes back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness_support import CODEX, StartStage, engine_saw, harness_binary, run_harness

CONTENT = "hello from the scripted engine"
PATCH = f"*** Begin Patch\n*** Add File: out.txt\n+{CONTENT}\n*** End Patch\n"
FINAL = "The file out.txt now holds the greeting."
TOKEN_VARIABLE = "KERAUNOS_AGENT_TOKEN"


def _config(base_url: str, model: str = "policy-model") -> str:
    # danger-full-access: the temp directory needs no sandbox, and the bundled bubblewrap needs user
    # namespaces that CI containers may not give.
    return f"""\
model = "{model}"
model_provider = "keraunos"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.keraunos]
name = "keraunos gateway"
base_url = "{base_url}"
wire_api = "responses"
env_key = "{TOKEN_VARIABLE}"

[analytics]
enabled = false

[otel]
exporter = "none"
"""


@pytest.mark.parametrize("native", [False, True], ids=["converted", "native"])
def test_codex_cli_runs_a_shell_command_through_the_gateway_and_its_calls_are_recorded_to_the_token_and_merge_into_one_row(
    stage: StartStage, tmp_path: Path, native: bool
) -> None:
    """Converted (the engine's chat endpoint), and native: the engine serves the Responses API
    itself (docs/harnesses.md#native-responses), where vLLM, as the stand-in, gives no log probs
    for an answer that is only a tool call."""
    codex = harness_binary(CODEX)
    work = tmp_path / "work"
    work.mkdir()
    script = [
        {"when": {"role": "tool"}, "reply": {"text": FINAL}},
        {
            "reply": {
                "tool_calls": [
                    {"name": "exec_command", "arguments": {"cmd": f"printf '{CONTENT}' > out.txt"}}
                ]
            }
        },
    ]
    staged = stage(script, native=native)
    home = tmp_path / "home"
    (home / "codex").mkdir(parents=True)
    (home / "codex" / "config.toml").write_text(_config(staged.prefix("openai") + "/v1"), encoding="utf-8")
    env = {"HOME": str(home), "CODEX_HOME": str(home / "codex"), TOKEN_VARIABLE: staged.agent_token}
    command = [codex, "exec", "--skip-git-repo-check", "Write the greeting into out.txt."]
    result = run_harness(command, cwd=work, env=env)

    assert result.returncode == 0, f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
    assert result.stdout.strip().splitlines()[-1] == FINAL
    assert (work / "out.txt").read_text() == CONTENT

    calls = staged.model_calls()
    assert len(calls) == engine_saw(staged.engine) == 2  # the command, then the text
    assert staged.engine.stats()["by_path"].get("/v1/responses", 0) == (2 if native else 0)
    for call in calls:
        assert call["api"] == "openai.responses" and call["server"].get("native", False) is native
        response = call["response"]
        assert len(response["prompt_token_ids"]) > 0
        assert len(response["choices"][0]["token_ids"]) > 0
    logprobs = [call["response"]["choices"][0]["logprobs"] is not None for call in calls]
    assert logprobs == ([False, True] if native else [True, True])
    assert calls[0]["response"]["choices"][0]["finish_reason"] == "tool_calls"
    assert calls[1]["response"]["choices"][0]["message"]["content"] == FINAL

    # The second call continues the first to the token: one training row, trained on both replies.
    built = staged.rows()
    assert built.metrics["breaks"] == 0, built.breaks
    assert len(built.rows) == 1 and built.rows.n_calls.tolist() == [2]
    replies = [call["response"]["choices"][0]["token_ids"] for call in calls]
    response_part = built.rows.input_ids[0, built.rows.prompt_len :]
    assert response_part[built.rows.response_mask[0] == 1].tolist() == replies[0] + replies[1]


def test_codex_cli_on_a_model_of_its_catalog_applies_a_freeform_patch_through_the_custom_apply_patch_tool(
    stage: StartStage, tmp_path: Path
) -> None:
    """With a model name from Codex's bundled catalog (gpt-5.5), Codex offers `apply_patch` as a
    `custom` tool with a Lark grammar: the gateway serves it as a chat function whose one string
    argument `input` is the patch, and the call goes back to Codex as a `custom_tool_call`."""
    codex = harness_binary(CODEX)
    work = tmp_path / "work"
    work.mkdir()
    script = [
        {"when": {"role": "tool"}, "reply": {"text": FINAL}},
        {"reply": {"tool_calls": [{"name": "apply_patch", "arguments": {"input": PATCH}}]}},
    ]
    staged = stage(script)
    home = tmp_path / "home"
    (home / "codex").mkdir(parents=True)
    config = _config(staged.prefix("openai") + "/v1", model="gpt-5.5")
    (home / "codex" / "config.toml").write_text(config, encoding="utf-8")
    env = {"HOME": str(home), "CODEX_HOME": str(home / "codex"), TOKEN_VARIABLE: staged.agent_token}
    command = [codex, "exec", "--skip-git-repo-check", "Write the greeting into out.txt."]
    result = run_harness(command, cwd=work, env=env)

    assert result.returncode == 0, f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
    assert result.stdout.strip().splitlines()[-1] == FINAL
    assert (work / "out.txt").read_text() == CONTENT + "\n"
    calls = staged.model_calls()
    assert len(calls) == engine_saw(staged.engine) == 2
    assert [call["api"] for call in calls] == ["openai.responses"] * 2
    offered = {tool["function"]["name"]: tool for tool in calls[0]["request"]["tools"]}
    assert offered["apply_patch"]["function"]["parameters"]["required"] == ["input"]
    built = staged.rows()
    assert built.metrics["breaks"] == 0, built.breaks
    assert len(built.rows) == 1 and built.rows.n_calls.tolist() == [2]

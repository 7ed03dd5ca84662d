"""Claude Code (`@anthropic-ai/claude-code`, pinned in harness_support) through the gateway's
Messages route, as a user points it at a rollout: `ANTHROPIC_BASE_URL` = the attempt's
`.../mode/train/anthropic` prefix (it appends `/v1/messages?beta=true`), the attempt's agent token
as `ANTHROPIC_API_KEY` (sent as `x-api-key`), telemetry and non-essential traffic off.

The engine stand-in's script makes the model call Claude Code's `Write` tool on a file of the temp
directory, then answer in text once the tool result comes back.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness_support import CLAUDE_CODE, StartStage, engine_saw, harness_binary, run_harness

CONTENT = "hello from the scripted engine"
FINAL = "The file out.txt now holds the greeting."


def test_claude_code_writes_a_file_through_the_gateway_and_its_calls_are_recorded_to_the_token_and_merge_into_one_row(
    stage: StartStage, tmp_path: Path
) -> None:
    claude = harness_binary(CLAUDE_CODE)
    work = tmp_path / "work"
    work.mkdir()
    target = work / "out.txt"
    script = [
        {"when": {"role": "tool"}, "reply": {"text": FINAL}},
        {
            "reply": {
                "tool_calls": [{"name": "Write", "arguments": {"file_path": str(target), "content": CONTENT}}]
            }
        },
    ]
    staged = stage(script)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": staged.prefix("anthropic"),
        "ANTHROPIC_API_KEY": staged.agent_token,
        "ANTHROPIC_MODEL": "policy-model",
        # A side call (titles, summaries) would name the small/fast model, which the gateway's
        # default --side-call-models (*haiku*) marks; in -p mode Claude Code makes none.
        "ANTHROPIC_SMALL_FAST_MODEL": "policy-model-haiku",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "policy-model-haiku",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    # As root (CI containers) --dangerously-skip-permissions is refused; allowing the tools is enough.
    command = [claude, "-p", "Write the greeting into out.txt.", "--output-format", "json"]
    command += ["--allowedTools", "Write", "Read", "Bash", "--permission-mode", "acceptEdits"]
    result = run_harness(command, cwd=work, env=env)

    assert result.returncode == 0, f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
    answer = json.loads(result.stdout)
    assert (answer["subtype"], answer["is_error"], answer["result"]) == ("success", False, FINAL)
    assert target.read_text() == CONTENT

    calls = staged.model_calls()
    assert len(calls) == engine_saw(staged.engine) == 2  # the tool call, then the text
    for call in calls:
        assert call["api"] == "anthropic.messages"
        assert "side_call" not in call  # both are the task's own calls
        response = call["response"]
        assert len(response["prompt_token_ids"]) > 0
        assert len(response["choices"][0]["token_ids"]) > 0
        assert response["choices"][0]["logprobs"] is not None
    assert calls[0]["response"]["choices"][0]["finish_reason"] == "tool_calls"
    assert calls[1]["response"]["choices"][0]["message"]["content"] == FINAL

    # The second call continues the first to the token, so the two make one training row whose
    # trained ids are both replies.
    built = staged.rows()
    assert built.metrics["breaks"] == 0, built.breaks
    assert len(built.rows) == 1 and built.rows.n_calls.tolist() == [2]
    replies = [call["response"]["choices"][0]["token_ids"] for call in calls]
    response_part = built.rows.input_ids[0, built.rows.prompt_len :]
    assert response_part[built.rows.response_mask[0] == 1].tolist() == replies[0] + replies[1]


def test_ci_installs_the_harness_versions_the_tests_pin() -> None:
    from harness_support import CODEX
    from prerequisites import REPO

    script = (REPO / ".ci" / "run").read_text()
    assert f"CLAUDE_CODE_VERSION={CLAUDE_CODE[2]}\n" in script
    assert f"CODEX_VERSION={CODEX[2]}\n" in script

"""Scripted replies of the engine stand-in (`keraunos engine-mock --script FILE`).

A real `keraunos engine-mock` process with a script file: the first matching rule answers (text
and/or tool calls), streamed as a real engine streams tool calls, with token ids and logprobs that
keep the prompt-grows-by-the-response property; unmatched requests get generated tokens.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from keraunos.testing._engine_tokens import Tokenizer, message_text
from keraunos.testing.processes import SERVED_MODEL, Engine, clean_env, keraunos_command, start_engine

OTHER_MODEL = "test/small-model"
WRITE_ARGS = {"file_path": "/tmp/out.txt", "content": "hello world"}
PATCH = "*** Begin Patch\n*** Add File: out.txt\n+hello\n*** End Patch\n"
SCRIPT = [
    {"when": {"role": "tool"}, "reply": {"text": "All done."}},
    {"when": {"model": OTHER_MODEL}, "reply": {"text": "A short title"}},
    {
        "when": {"regex": r"patch \w+\.txt"},
        "reply": {"tool_calls": [{"name": "apply_patch", "arguments": PATCH}]},
    },
    {
        "when": {"contains": "out.txt"},
        "reply": {"text": "Writing it.", "tool_calls": [{"name": "Write", "arguments": WRITE_ARGS}]},
    },
]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("scripted")
    script = base / "script.yaml"
    script.write_text(json.dumps(SCRIPT))  # JSON is YAML: one loader reads both
    engine = start_engine(
        base, ["--script", str(script), "--served-model-name", f"{SERVED_MODEL},{OTHER_MODEL}"]
    )
    yield engine
    engine.kill()


def _chat(engine: Engine, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    payload = {"model": SERVED_MODEL, "messages": messages, "return_token_ids": True, **body}
    response = httpx.post(f"{engine.endpoint}/chat/completions", json=payload, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _stream(engine: Engine, messages: list[dict[str, Any]], **body: Any) -> list[Any]:
    payload = {"model": SERVED_MODEL, "messages": messages, "return_token_ids": True, "stream": True, **body}
    with httpx.stream("POST", f"{engine.endpoint}/chat/completions", json=payload, timeout=10) as response:
        assert response.status_code == 200
        text = response.read().decode()
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    assert events[-1] == "[DONE]"
    return [orjson.loads(event) for event in events[:-1]]


USER = [{"role": "user", "content": "please write out.txt"}]


def test_a_matching_request_gets_the_scripted_text_and_tool_call_with_the_ids_of_the_message_as_sent_back(
    scripted: Engine,
) -> None:
    answer = _chat(scripted, USER, logprobs=True, top_logprobs=2)
    choice = answer["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["content"] == "Writing it."
    [call] = message["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "Write", "arguments": json.dumps(WRITE_ARGS)}
    tokenizer = Tokenizer(151936)
    assert choice["token_ids"] == tokenizer.encode(message_text(message, 0))
    assert [entry["token"] for entry in choice["logprobs"]["content"]][:2] == ["Writing", " it."]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert answer["usage"]["completion_tokens"] == len(choice["token_ids"])

    # The agent sends the call back with its result: the next prompt is the previous prompt, the
    # reply's ids, then the tool message, and the tool result matches the first rule.
    follow_up = [*USER, {k: message[k] for k in ("role", "content", "tool_calls")}]
    follow_up.append({"role": "tool", "tool_call_id": call["id"], "content": "File created"})
    second = _chat(scripted, follow_up)
    grown = answer["prompt_token_ids"] + choice["token_ids"]
    assert second["prompt_token_ids"][: len(grown)] == grown
    assert second["choices"][0]["message"]["content"] == "All done."
    assert second["choices"][0]["message"]["tool_calls"] == []
    assert second["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_scripted_tool_call_has_id_and_name_first_then_its_arguments_in_pieces_with_the_same_ids(
    scripted: Engine,
) -> None:
    whole = _chat(scripted, USER, logprobs=True)["choices"][0]
    events = _stream(scripted, USER, logprobs=True, stream_options={"include_usage": True})
    deltas = [event["choices"][0] for event in events if event["choices"]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    assert "prompt_token_ids" in events[0]
    text = "".join(d["delta"].get("content") or "" for d in deltas)
    calls = [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
    assert text == "Writing it."
    assert calls[0]["id"].startswith("chatcmpl-tool-") and calls[0]["function"] == {"name": "Write"}
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])
    assert len(calls) > 2  # the arguments come in several pieces
    assert "".join(c["function"]["arguments"] for c in calls[1:]) == json.dumps(WRITE_ARGS)
    assert [d["finish_reason"] for d in deltas] == [None] * (len(deltas) - 1) + ["tool_calls"]
    assert [i for d in deltas for i in d.get("token_ids", [])] == whole["token_ids"]
    streamed_logprobs = [e for d in deltas if d["logprobs"] for e in d["logprobs"]["content"]]
    assert streamed_logprobs == whole["logprobs"]["content"]
    assert events[-1]["usage"]["completion_tokens"] == len(whole["token_ids"])


def test_rules_are_tried_in_order_on_role_model_regex_and_substring_and_string_arguments_go_verbatim(
    scripted: Engine,
) -> None:
    # The model rule comes before the substring rule: the small model's request gets the title.
    titled = _chat(scripted, USER, model=OTHER_MODEL)["choices"][0]["message"]
    assert titled["content"] == "A short title"
    patched = _chat(scripted, [{"role": "user", "content": "patch out.txt please"}])["choices"][0]
    assert patched["message"]["content"] is None
    assert patched["message"]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": PATCH}
    streamed = _stream(scripted, [{"role": "user", "content": "patch out.txt please"}])
    pieces = [
        e["choices"][0]["delta"]["tool_calls"][0]
        for e in streamed
        if "tool_calls" in e["choices"][0]["delta"]
    ]
    assert "".join(p["function"].get("arguments", "") for p in pieces) == PATCH


def test_a_request_no_rule_matches_gets_the_generated_tokens_of_an_engine_without_a_script(
    scripted: Engine, tmp_path: Path
) -> None:
    plain = start_engine(tmp_path, ["--served-model-name", f"{SERVED_MODEL},{OTHER_MODEL}"])
    try:
        messages = [{"role": "user", "content": "nothing to match here"}]
        assert _chat(scripted, messages, seed=3)["choices"] == _chat(plain, messages, seed=3)["choices"]
        completion = {"model": SERVED_MODEL, "prompt": "out.txt", "max_tokens": 5}
        scripted_text = httpx.post(f"{scripted.endpoint}/completions", json=completion).json()["choices"]
        plain_text = httpx.post(f"{plain.endpoint}/completions", json=completion).json()["choices"]
        assert scripted_text == plain_text  # scripts are for chat; completions are generated
    finally:
        plain.kill()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("- when: {role: tool}\n", "0.reply: Field required"),
        ("- when: {regex: '('}\n  reply: {text: x}\n", "0.when.regex"),
        ("- when: {}\n  reply: {}\n", "a reply needs 'text' or 'tool_calls'"),
        ("{rules: []}\n", "must be a list of {when, reply} rules"),
        ("- [unclosed\n", "is neither YAML nor JSON"),
    ],
)
def test_a_bad_script_stops_the_engine_at_start_with_one_line_naming_the_file_and_the_rule(
    tmp_path: Path, content: str, said: str
) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text(content)
    result = subprocess.run(
        keraunos_command("engine-mock", "--port", "1", "--script", str(script)),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert str(script) in line and said in line

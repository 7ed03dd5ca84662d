"""The Anthropic Messages dialect: requests become the chat requests a chat agent would send, and the
engine's chat answers, whole or streamed, become what the official `anthropic` SDK parses.

The SDK is the judge of the answers: it talks to the dialect through `httpx.MockTransport` (a
function from request to response at the HTTP seam), answered with `from_chat` JSON or with the
translator's bytes for a scripted chat completion and its vLLM-shaped chunks. The gateway's own
routes are tested through a real gateway elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2 as httpx  # the anthropic SDK runs on httpx2 (httpx's successor), whose client it requires
import pytest
from dialect_mutations import DELETE, mutated, paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.gateway.dialects.anthropic import MESSAGES, message_id
from keraunos.gateway.dialects.base import DialectRequestError

BODY: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "hi"}],
}


# -- scripted chat answers, in vLLM's shapes -------------------------------------------------------


def completion(
    content: str | None = "Hello there.",
    *,
    tool_calls: tuple[tuple[str, str, str], ...] | list[tuple[str, str, str]] = (),
    finish: str = "stop",
    stop_reason: str | int | None = None,
    reasoning: str | None = None,
    prompt_tokens: int = 12,
    completion_tokens: int = 5,
    cached: int | None = None,
    completion_id: str = "chatcmpl-abc123",
) -> dict[str, Any]:
    """A chat completion as vLLM answers it; `tool_calls` are (id, name, arguments text)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }
    calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in tool_calls
    ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": 1,
        "model": "Qwen/Qwen3-0.6B",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "reasoning_content": reasoning,
                    "tool_calls": calls,
                },
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": list(range(completion_tokens)),
            }
        ],
        "usage": usage,
        "prompt_token_ids": list(range(prompt_tokens)),
    }


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks vLLM streams for `answer`: the role (with the prompt ids), reasoning and text in
    pieces, each tool call's id and name then its arguments in pieces, the finish, the usage."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": 1, "model": answer["model"]}

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}],
        }

    out = [{**chunk({"role": "assistant", "content": ""}), "prompt_token_ids": answer["prompt_token_ids"]}]
    out += [
        chunk({"reasoning_content": p}, token_ids=[1]) for p in _pieces(message["reasoning_content"] or "")
    ]
    out += [chunk({"content": p}, token_ids=[1]) for p in _pieces(message["content"] or "")]
    for index, call in enumerate(message["tool_calls"]):
        first = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        out.append(chunk({"tool_calls": [first]}))
        for piece in _pieces(call["function"]["arguments"], 3):
            out.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, token_ids=[1])
            )
    out.append(chunk({}, finish_reason=choice["finish_reason"], stop_reason=choice["stop_reason"]))
    out.append({**head, "choices": [], "usage": answer["usage"]})
    return out


def stream_bytes(body: dict[str, Any], answer: dict[str, Any]) -> bytes:
    translator = MESSAGES.translator(body)
    return b"".join(translator.feed(c) for c in chunks(answer)) + translator.finish()


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event, checking the framing `event: NAME\\ndata: JSON\\n\\n`."""
    assert data.endswith(b"\n\n")
    out = []
    for raw in data[:-2].split(b"\n\n"):
        name_line, data_line = raw.split(b"\n")
        assert name_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        payload = json.loads(data_line[6:])
        assert payload["type"] == name_line[7:].decode()
        out.append((payload["type"], payload))
    return out


class Engine:
    """The HTTP seam the SDK calls: converts its request and answers with the scripted `answer`."""

    def __init__(self, answer: dict[str, Any], *, status: int = 200) -> None:
        self.answer = answer
        self.status = status
        self.chat_requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if self.status != 200:
            return httpx.Response(self.status, content=MESSAGES.error_body(self.status, "engine says no"))
        self.chat_requests.append(MESSAGES.to_chat(body))
        if body.get("stream"):
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=stream_bytes(body, self.answer)
            )
        return httpx.Response(200, json=MESSAGES.from_chat(body, self.answer))

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            api_key="key",
            base_url="http://gateway.test/proxy/rollout/r/attempt/a/mode/train/anthropic",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(self)),
        )


# -- requests --------------------------------------------------------------------------------------


def test_the_dialect_is_named_as_recorded_and_fits_the_seam() -> None:
    assert MESSAGES.name == "anthropic.messages"


ROUND_TRIPS: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    (
        "plain text turns, system as a string",
        {
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": [{"type": "text", "text": "4"}]},
                {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]},
            ],
        },
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    ),
    (
        "a tool call and its result, then the final answer asked for",
        {
            "system": [
                {"type": "text", "text": "You are a coding agent."},
                {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": "Read a.txt"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "I should read it.", "signature": "sig"},
                        {"type": "text", "text": "Reading."},
                        {
                            "type": "tool_use",
                            "id": "call_1",
                            "name": "Read",
                            "input": {"path": "a.txt", "n": 1},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "call_1",
                            "content": "hello",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                },
            ],
        },
        [
            {"role": "system", "content": "You are a coding agent.\nUse tools."},
            {"role": "user", "content": "Read a.txt"},
            {
                "role": "assistant",
                "content": "Reading.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "Read", "arguments": '{"path": "a.txt", "n": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        ],
    ),
    (
        "two parallel calls answered in one user turn with text around them: results first, in order",
        {
            "messages": [
                {"role": "user", "content": "Look at both."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "x"}},
                        {"type": "tool_use", "id": "t2", "name": "Read", "input": {"path": "ü"}},
                        {"type": "redacted_thinking", "data": "opaque"},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Here:"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "X"}],
                        },
                        {"type": "text", "text": "and"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "is_error": True,
                            "content": "no such file",
                        },
                    ],
                },
            ]
        },
        [
            {"role": "user", "content": "Look at both."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "Read", "arguments": '{"path": "x"}'},
                    },
                    {
                        "id": "t2",
                        "type": "function",
                        "function": {"name": "Read", "arguments": '{"path": "ü"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "X"},
            {"role": "tool", "tool_call_id": "t2", "content": "no such file"},
            {"role": "user", "content": [{"type": "text", "text": "Here:"}, {"type": "text", "text": "and"}]},
        ],
    ),
    (
        "images as base64 and url sources, in a user turn and in a tool result",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                        },
                        {"type": "text", "text": "What is this?"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "s", "name": "Shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "s",
                            "content": [
                                {"type": "text", "text": "screen:"},
                                {"type": "image", "source": {"type": "url", "url": "https://x.test/s.png"}},
                            ],
                        }
                    ],
                },
            ]
        },
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                    {"type": "text", "text": "What is this?"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "s", "type": "function", "function": {"name": "Shot", "arguments": "{}"}}
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "s",
                "content": [
                    {"type": "text", "text": "screen:"},
                    {"type": "image_url", "image_url": {"url": "https://x.test/s.png"}},
                ],
            },
        ],
    ),
    (
        "Claude Code's shape: a system turn inside messages, kept in place as a system message",
        {
            "system": [
                {"type": "text", "text": "billing header"},
                {"type": "text", "text": "You are Claude Code."},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "<reminder>"},
                        {"type": "text", "text": "Write f.txt"},
                    ],
                },
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "w", "name": "Write", "input": {"file_path": "f.txt"}}
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "w", "content": "ok"}]},
            ],
        },
        [
            {"role": "system", "content": "billing header\nYou are Claude Code."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Write f.txt"}],
            },
            {"role": "system", "content": "# Environment"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "w",
                        "type": "function",
                        "function": {"name": "Write", "arguments": '{"file_path": "f.txt"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "w", "content": "ok"},
        ],
    ),
]


@pytest.mark.parametrize(("case", "body", "expected"), ROUND_TRIPS, ids=[c[0] for c in ROUND_TRIPS])
def test_a_conversation_becomes_the_chat_messages_a_chat_agent_would_have_sent(
    case: str, body: dict[str, Any], expected: list[dict[str, Any]]
) -> None:
    chat = MESSAGES.to_chat({"model": "m", "max_tokens": 10, **body})
    assert chat["messages"] == expected


def test_what_the_answer_becomes_in_the_next_request_is_what_the_chat_answer_said() -> None:
    """The loop a harness runs: answer -> its blocks echoed back -> the same tool call in chat form,
    its arguments the very text vLLM's tool parsers write (`json.dumps`, default separators), so the
    re-rendered turn is the sampled one and the trajectory merge holds."""
    arguments = json.dumps({"path": "a.txt", "text": "é\n", "n": [1, 2.5]}, ensure_ascii=False)
    answer = completion(
        "Let me look.", tool_calls=[("chatcmpl-tool-9", "Read", arguments)], finish="tool_calls"
    )
    message = MESSAGES.from_chat(BODY, answer)
    follow_up = {
        **BODY,
        "messages": [
            *BODY["messages"],
            {"role": "assistant", "content": message["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "chatcmpl-tool-9", "content": "A"}],
            },
        ],
    }
    messages = MESSAGES.to_chat(follow_up)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "chatcmpl-tool-9",
                "type": "function",
                "function": {"name": "Read", "arguments": arguments},
            }
        ],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "chatcmpl-tool-9", "content": "A"}


def test_sampling_settings_map_to_their_chat_names_and_unknown_fields_are_ignored() -> None:
    chat = MESSAGES.to_chat(
        {
            **BODY,
            "stop_sequences": ["END", "\n\nHuman:"],
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "metadata": {"user_id": "u-1"},
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "output_config": {"effort": "high"},
            "service_tier": "auto",
        }
    )
    assert chat == {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 256,
        "stop": ["END", "\n\nHuman:"],
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "user": "u-1",
        "stream": True,
    }


@pytest.mark.parametrize(
    "thinking",
    [
        {"type": "enabled", "budget_tokens": 2048},
        {"type": "disabled"},
        {"type": "adaptive", "display": "omitted"},
        {"type": "between_tools"},
        {"type": "a_type_still_to_come", "level": 3},
        {"type": "enabled"},
    ],
)
def test_thinking_settings_are_accepted_and_not_forwarded(thinking: dict[str, Any]) -> None:
    assert MESSAGES.to_chat({**BODY, "thinking": thinking}) == MESSAGES.to_chat(BODY)


def test_client_tools_become_function_tools_and_extra_tool_fields_are_ignored() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"q": {"type": "string"}},
    }
    chat = MESSAGES.to_chat(
        {
            **BODY,
            "tools": [
                {
                    "name": "Search",
                    "description": "Find things.",
                    "input_schema": schema,
                    "cache_control": {"type": "ephemeral"},
                },
                {
                    "type": "custom",
                    "name": "Later",
                    "input_schema": {"type": "object"},
                    "defer_loading": True,
                },
            ],
        }
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "Search", "description": "Find things.", "parameters": schema},
        },
        {"type": "function", "function": {"name": "Later", "parameters": {"type": "object"}}},
    ]


@pytest.mark.parametrize(
    "tool_type", ["web_search_20250305", "bash_20250124", "text_editor_20250728", "computer_20250124"]
)
def test_a_server_tool_is_left_out_since_a_local_engine_cannot_run_it(tool_type: str) -> None:
    client_tool = {"name": "ok", "input_schema": {"type": "object"}}
    server_tool = {"type": tool_type, "name": "x", "max_uses": 5}
    chat = MESSAGES.to_chat({**BODY, "tools": [server_tool, client_tool]})
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}}
    ]
    assert "tools" not in MESSAGES.to_chat({**BODY, "tools": [server_tool]})


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "Read"},
            {"tool_choice": {"type": "function", "function": {"name": "Read"}}},
        ),
        (
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_tool_choice_maps_to_the_chat_tool_choice(
    tool_choice: dict[str, Any], expected: dict[str, Any]
) -> None:
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    chat = MESSAGES.to_chat({**BODY, "tools": tools, "tool_choice": tool_choice})
    assert {k: v for k, v in chat.items() if k in ("tool_choice", "parallel_tool_calls")} == expected


def test_with_no_tool_left_for_the_engine_the_tool_choice_is_left_out_too() -> None:
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    body = {**BODY, "tools": [server_tool], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    assert MESSAGES.to_chat(body) == MESSAGES.to_chat(BODY)


def test_a_user_id_longer_than_openais_limit_is_not_forwarded() -> None:
    assert MESSAGES.to_chat({**BODY, "metadata": {"user_id": "u" * 256}})["user"] == "u" * 256
    assert "user" not in MESSAGES.to_chat({**BODY, "metadata": {"user_id": "u" * 257}})


def test_a_final_assistant_turn_is_a_prefill_the_answer_continues() -> None:
    body = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "The answer is ("}]}
    chat = MESSAGES.to_chat(body)
    assert chat["messages"][-1] == {"role": "assistant", "content": "The answer is ("}
    assert chat["add_generation_prompt"] is False and chat["continue_final_message"] is True
    assert "continue_final_message" not in MESSAGES.to_chat(BODY)


MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({"model": "m", "messages": []}, "max_tokens"),
    ({**BODY, "messages": []}, "messages"),
    ({**BODY, "max_tokens": "256"}, "max_tokens"),
    ({**BODY, "max_tokens": True}, "max_tokens"),
    ({**BODY, "max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "model"),
    ({**BODY, "messages": "hi"}, "messages"),
    ({**BODY, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({**BODY, "messages": [{"role": "user"}]}, "messages.0.content"),
    (
        {**BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": 3}]}]},
        "messages.0.content.1.type",
    ),
    ({**BODY, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    (
        {
            **BODY,
            "messages": [
                {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}
            ],
        },
        "messages.0.content.0.type",
    ),
    (
        {
            **BODY,
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "a", "name": "b", "input": "{}"}],
                }
            ],
        },
        "messages.0.content.0.input",
    ),
    (
        {**BODY, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
        "messages.0.content.0.tool_use_id",
    ),
    (
        {
            **BODY,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "yes"}]}
            ],
        },
        "messages.0.content.0.is_error",
    ),
    (
        {
            **BODY,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}
            ],
        },
        "messages.0.content.0.source.type",
    ),
    ({**BODY, "system": 5}, "system"),
    ({**BODY, "system": [{"type": "image"}]}, "system.0.type"),
    ({**BODY, "stop_sequences": "END"}, "stop_sequences"),
    ({**BODY, "stop_sequences": ["END", 1]}, "stop_sequences.1"),
    ({**BODY, "temperature": "hot"}, "temperature"),
    ({**BODY, "top_k": 4.5}, "top_k"),
    ({**BODY, "metadata": {"user_id": 7}}, "metadata.user_id"),
    ({**BODY, "thinking": "on"}, "thinking"),
    ({**BODY, "tools": [{"name": "x"}]}, "tools.0.input_schema"),
    ({**BODY, "tools": {"name": "x"}}, "tools"),
    ({**BODY, "tool_choice": "auto"}, "tool_choice"),
    ({**BODY, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({**BODY, "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({**BODY, "stream": "yes"}, "stream"),
]


@pytest.mark.parametrize(("body", "param"), MALFORMED, ids=[p for _, p in MALFORMED])
def test_a_body_the_api_would_refuse_is_a_400_naming_the_offending_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(DialectRequestError) as caught:
        MESSAGES.to_chat(body)
    assert caught.value.param == param
    assert caught.value.status == 400
    assert caught.value.message.startswith(f"{param}: ")


# -- answers ---------------------------------------------------------------------------------------


def test_a_text_answer_is_a_message_under_the_requested_model_name_with_an_id_from_the_completion() -> None:
    message = MESSAGES.from_chat(BODY, completion("Hello there."))
    assert message == {
        "id": message_id("chatcmpl-abc123"),
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Hello there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }
    assert message["id"].startswith("msg_")
    assert MESSAGES.from_chat(BODY, completion("other"))["id"] == message["id"]
    assert MESSAGES.from_chat(BODY, completion(completion_id="chatcmpl-other"))["id"] != message["id"]


def test_tool_calls_become_tool_use_blocks_with_their_ids_and_parsed_input() -> None:
    answer = completion(
        "",
        reasoning="Two files.",
        tool_calls=[
            ("call_a", "Read", '{"path": "a"}'),
            ("call_b", "Read", "not json"),
            ("call_c", "Run", "[1, 2]"),
        ],
        finish="tool_calls",
    )
    message = MESSAGES.from_chat(BODY, answer)
    assert message["content"] == [
        {"type": "thinking", "thinking": "Two files.", "signature": ""},
        {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"path": "a"}},
        {"type": "tool_use", "id": "call_b", "name": "Read", "input": {}},
        {"type": "tool_use", "id": "call_c", "name": "Run", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"


def test_thinking_shown_as_an_empty_block_when_the_agent_asked_for_it_omitted() -> None:
    body = {**BODY, "thinking": {"type": "adaptive", "display": "omitted"}}
    message = MESSAGES.from_chat(body, completion("Done.", reasoning="secret"))
    assert message["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}


@pytest.mark.parametrize(
    ("finish", "stop_reason", "stop_sequences", "expected"),
    [
        ("stop", None, None, ("end_turn", None)),
        ("stop", 151645, None, ("end_turn", None)),  # vLLM names a stop token by its id
        ("stop", "END", ["END"], ("stop_sequence", "END")),
        ("stop", "END", ["OTHER"], ("end_turn", None)),
        ("length", None, None, ("max_tokens", None)),
        ("tool_calls", None, None, ("end_turn", None)),  # no call the answer could show
        ("content_filter", None, None, ("refusal", None)),
    ],
)
def test_the_finish_reason_becomes_the_stop_reason(
    finish: str, stop_reason: Any, stop_sequences: list[str] | None, expected: tuple[str, str | None]
) -> None:
    body = {**BODY, "stop_sequences": stop_sequences} if stop_sequences else BODY
    message = MESSAGES.from_chat(body, completion("x", finish=finish, stop_reason=stop_reason))
    assert (message["stop_reason"], message["stop_sequence"]) == expected


def test_cached_prompt_tokens_are_counted_as_cache_reads_not_input() -> None:
    message = MESSAGES.from_chat(BODY, completion(prompt_tokens=100, completion_tokens=7, cached=64))
    assert message["usage"] == {"input_tokens": 36, "output_tokens": 7, "cache_read_input_tokens": 64}


# -- the official SDK reads the answers ------------------------------------------------------------


ANSWERS = {
    "text": completion("Hello there, how are you today?"),
    "thinking then text": completion("It is 4.", reasoning="2+2 is 4, simple."),
    "text then two tool calls": completion(
        "Reading both.",
        tool_calls=[
            ("call_1", "Read", '{"path": "a.txt"}'),
            ("call_2", "Write", '{"path": "b", "text": "é\\n"}'),
        ],
        finish="tool_calls",
        cached=8,
    ),
    "a stop sequence": completion("one two", stop_reason="END"),
    "max tokens": completion("truncat", finish="length", completion_tokens=256),
    "nothing at all": completion(""),
}


def test_the_sdk_parses_a_text_answer_with_its_usage() -> None:
    engine = Engine(ANSWERS["text"])
    message = engine.client().messages.create(**BODY)
    assert isinstance(message, anthropic.types.Message)
    assert message.content[0].type == "text" and message.content[0].text == "Hello there, how are you today?"
    assert message.model == "claude-sonnet-4-5"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 5)
    assert engine.chat_requests == [
        {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}
    ]


def test_the_sdk_parses_tool_use_blocks_with_their_input_and_the_stop_reason() -> None:
    message = Engine(ANSWERS["text then two tool calls"]).client().messages.create(**BODY)
    blocks = [b for b in message.content if isinstance(b, anthropic.types.ToolUseBlock)]
    assert [(b.id, b.name, b.input) for b in blocks] == [
        ("call_1", "Read", {"path": "a.txt"}),
        ("call_2", "Write", {"path": "b", "text": "é\n"}),
    ]
    assert message.stop_reason == "tool_use"
    assert message.usage.cache_read_input_tokens == 8


def test_the_sdk_reports_the_stop_sequence_that_ended_the_answer() -> None:
    message = Engine(ANSWERS["a stop sequence"]).client().messages.create(**BODY, stop_sequences=["END"])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")


@pytest.mark.parametrize("case", list(ANSWERS))
def test_a_streamed_answer_folds_into_the_same_message_as_the_unstreamed_one(case: str) -> None:
    answer = ANSWERS[case]
    body = {**BODY, "stop_sequences": ["END"]}
    client = Engine(answer).client()
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    unstreamed = client.messages.create(**body)
    assert final.model_dump() == unstreamed.model_dump()
    expected = {key: value for key, value in MESSAGES.from_chat(body, answer).items() if value is not None}
    assert final.model_dump(exclude_none=True) == expected


def test_a_stream_has_every_event_type_the_sdk_defines_for_text_thinking_and_tool_use() -> None:
    answer = completion("Ok.", reasoning="Hm.", tool_calls=[("c1", "Read", '{"p": 1}')], finish="tool_calls")
    seen_raw: set[str] = set()
    seen_deltas: set[str] = set()
    seen_sdk: set[str] = set()
    with Engine(answer).client().messages.stream(**BODY) as stream:
        for event in stream:
            seen_sdk.add(event.type)
            if event.type == "content_block_delta":
                seen_deltas.add(event.delta.type)
    seen_raw = {name for name, _ in events(stream_bytes(BODY, answer))}
    assert seen_raw == {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
    assert seen_deltas == {"thinking_delta", "text_delta", "input_json_delta"}
    assert {"text", "thinking", "input_json"} <= seen_sdk  # the SDK's own events built on them


def test_the_stream_numbers_blocks_as_they_start_and_closes_text_when_a_tool_call_starts() -> None:
    answer = completion(
        "Hi all",
        reasoning="think",
        tool_calls=[("c1", "A", '{"x": 1}'), ("c2", "B", "{}")],
        finish="tool_calls",
    )
    sequence = []
    for name, data in events(stream_bytes(BODY, answer)):
        detail = data.get("delta", {}).get("type") or data.get("content_block", {}).get("type")
        sequence.append((name, data.get("index"), detail))
    assert sequence == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_stop", 3, None),  # `{}`: nothing to add to the block's empty input
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]


def test_message_delta_waits_for_finish_and_carries_the_usage_of_the_last_chunk() -> None:
    answer = completion("Hi", prompt_tokens=30, completion_tokens=2, cached=10)
    translator = MESSAGES.translator(BODY)
    fed = b"".join(translator.feed(c) for c in chunks(answer))
    assert b"message_delta" not in fed and b"message_stop" not in fed
    start = events(fed)[0][1]
    assert start["message"]["usage"] == {"input_tokens": 30, "output_tokens": 0}
    assert start["message"]["id"] == message_id("chatcmpl-abc123") and start["message"]["content"] == []
    closing = events(translator.finish())
    assert [name for name, _ in closing] == ["content_block_stop", "message_delta", "message_stop"]
    assert closing[1][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"input_tokens": 20, "output_tokens": 2, "cache_read_input_tokens": 10},
    }


def test_a_stream_whose_tool_arguments_are_not_an_object_streams_the_same_empty_input() -> None:
    answer = completion("", tool_calls=[("c1", "Read", '{"path": "a"')], finish="tool_calls")  # cut short
    with Engine(answer).client().messages.stream(**BODY) as stream:
        final = stream.get_final_message()
    assert final.content == [anthropic.types.ToolUseBlock(type="tool_use", id="c1", name="Read", input={})]


@pytest.mark.parametrize(("source", "kind"), [("upstream", "overloaded_error"), ("gateway", "api_error")])
def test_a_failed_stream_ends_with_an_error_event_the_sdk_raises(source: str, kind: str) -> None:
    answer = completion("Hello")
    translator = MESSAGES.translator(BODY)
    data = translator.feed(chunks(answer)[0]) + translator.feed(chunks(answer)[1])
    data += translator.fail("the engine went away", source=source)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=data)

    client = anthropic.Anthropic(
        api_key="k",
        base_url="http://g.test",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(anthropic.APIStatusError) as caught, client.messages.stream(**BODY) as stream:
        stream.get_final_message()
    assert caught.value.body == {"type": "error", "error": {"type": kind, "message": "the engine went away"}}


@pytest.mark.parametrize(
    ("status", "kind", "exception"),
    [
        (400, "invalid_request_error", anthropic.BadRequestError),
        (401, "authentication_error", anthropic.AuthenticationError),
        (403, "permission_error", anthropic.PermissionDeniedError),
        (404, "not_found_error", anthropic.NotFoundError),
        (409, "invalid_request_error", anthropic.ConflictError),
        (413, "request_too_large", anthropic.APIStatusError),
        (422, "invalid_request_error", anthropic.UnprocessableEntityError),
        (429, "rate_limit_error", anthropic.RateLimitError),
        (500, "api_error", anthropic.InternalServerError),
        (502, "api_error", anthropic.InternalServerError),
        (503, "overloaded_error", anthropic.InternalServerError),
        (529, "overloaded_error", anthropic.APIStatusError),
    ],
)
def test_an_error_answer_has_the_apis_shape_and_type_for_its_status(
    status: int, kind: str, exception: type[Exception]
) -> None:
    assert json.loads(MESSAGES.error_body(status, "no", code="rollout_not_found")) == {
        "type": "error",
        "error": {"type": kind, "message": "no", "code": "rollout_not_found"},
    }
    with pytest.raises(exception) as caught:
        Engine(completion(), status=status).client().messages.create(**BODY)
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.status_code == status
    assert caught.value.body == {"type": "error", "error": {"type": kind, "message": "engine says no"}}


# -- never anything but a dict or DialectRequestError ----------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
#: Keys of the API, so arbitrary objects reach past the first check now and then.
api_keys = st.sampled_from(
    [
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "thinking",
        "metadata",
        "stream",
        "temperature",
        "top_k",
        "role",
        "content",
        "type",
        "text",
        "input",
        "id",
        "name",
        "tool_use_id",
        "source",
        "input_schema",
        "budget_tokens",
        "user_id",
    ]
)
json_objects = st.dictionaries(api_keys | st.text(max_size=6), json_values, max_size=8)

VALID: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "go"},
                {"type": "image", "source": {"type": "url", "url": "u"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "a", "name": "R", "input": {"p": [1, 2.5]}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "a",
                    "is_error": False,
                    "content": [{"type": "text", "text": "r"}],
                }
            ],
        },
    ],
    "tools": [{"name": "R", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "stop_sequences": ["x"],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "metadata": {"user_id": "u"},
    "temperature": 1,
    "top_k": 3,
    "stream": True,
}


VALID_PATHS = [p for p in paths(VALID) if p]


def test_the_valid_body_the_mutations_start_from_converts() -> None:
    assert MESSAGES.to_chat(VALID)["messages"][-1] == {"role": "tool", "tool_call_id": "a", "content": "r"}


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(json_objects)
def test_any_json_object_converts_or_is_refused_with_a_dialect_error(body: dict[str, Any]) -> None:
    try:
        assert isinstance(MESSAGES.to_chat(body), dict)
    except DialectRequestError as error:
        assert error.status == 400 and error.message


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=600,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.sampled_from(VALID_PATHS), st.just(DELETE) | json_values)
def test_a_valid_body_with_any_one_part_replaced_or_removed_converts_or_is_refused(
    path: tuple[Any, ...], replacement: Any
) -> None:
    try:
        chat = MESSAGES.to_chat(mutated(VALID, path, replacement))
    except DialectRequestError as error:
        assert error.status == 400 and error.message
        return
    assert isinstance(chat, dict) and isinstance(chat["messages"], list)


def _maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


#: Chunk-shaped objects with any values where the translator looks, and any objects besides.
tool_call_deltas = _maybe(
    index=st.integers(0, 2) | json_values,
    id=st.text(max_size=4) | json_values,
    function=_maybe(name=st.text(max_size=4) | json_values, arguments=st.text(max_size=6) | json_values)
    | json_values,
)
chat_chunks = json_objects | _maybe(
    id=json_values,
    prompt_token_ids=st.lists(st.integers(0, 9), max_size=3) | json_values,
    usage=_maybe(prompt_tokens=json_values, completion_tokens=json_values, prompt_tokens_details=json_values)
    | json_values,
    choices=st.lists(
        _maybe(
            index=st.just(0) | json_values,
            delta=_maybe(
                content=st.text(max_size=4) | json_values,
                reasoning_content=st.text(max_size=4) | json_values,
                reasoning=st.text(max_size=4) | json_values,
                tool_calls=st.lists(tool_call_deltas, max_size=2) | json_values,
            )
            | json_values,
            finish_reason=st.sampled_from(["stop", "length", "tool_calls"]) | json_values,
            stop_reason=json_values,
            token_ids=st.lists(st.integers(0, 9), max_size=3) | json_values,
        )
        | json_values,
        max_size=2,
    )
    | json_values,
)
chat_completions = json_objects | _maybe(
    id=json_values,
    choices=st.lists(
        _maybe(
            message=_maybe(
                content=st.text(max_size=4) | json_values,
                reasoning_content=json_values,
                tool_calls=st.lists(tool_call_deltas, max_size=2) | json_values,
            )
            | json_values,
            finish_reason=json_values,
            stop_reason=json_values,
        )
        | json_values,
        max_size=2,
    )
    | json_values,
    usage=json_values,
)


@settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(chat_chunks, max_size=6), chat_completions)
def test_any_chunks_and_any_completion_become_events_and_a_message_without_raising(
    stream: list[dict[str, Any]], answer: dict[str, Any]
) -> None:
    translator = MESSAGES.translator(BODY)
    data = b"".join(translator.feed(chunk) for chunk in stream) + translator.finish()
    assert [name for name, _ in events(data)][-2:] == ["message_delta", "message_stop"]
    assert MESSAGES.from_chat(BODY, answer)["type"] == "message"


@pytest.mark.parametrize("reasoning", [None, "First the weather."], ids=["text", "text after thinking"])
def test_a_text_chunk_makes_the_same_event_bytes_on_the_fast_path_as_through_the_general_one(
    reasoning: str | None,
) -> None:
    # The usual chunk (a text delta alone) is written without building its event's dict; a delta
    # with one more key (`"role": None`) goes the general way: the bytes must not differ, nor the
    # output token count of the closing `message_delta`.
    answer = completion('Sunny and warm, 21 "degrees", a light wind from the west.\n', reasoning=reasoning)
    plain = chunks(answer)
    padded = [
        {**c, "choices": [{**ch, "delta": {**ch["delta"], "role": None}} for ch in c["choices"]]}
        if c.get("choices") and "content" in c["choices"][0].get("delta", {})
        else c
        for c in plain
    ]
    fast, general = MESSAGES.translator(BODY), MESSAGES.translator(BODY)
    fast_bytes = b"".join(fast.feed(c) for c in plain) + fast.finish()
    assert fast_bytes == b"".join(general.feed(c) for c in padded) + general.finish()
    assert fast_bytes.count(b'"text_delta"') == len(_pieces(answer["choices"][0]["message"]["content"]))

"""The OpenAI Responses dialect: Responses bodies (as the `openai` SDK, the OpenAI Agents SDK and Codex
CLI send them) become the chat requests a chat agent would send, and the engine's chat answers,
whole or streamed, become what the official `openai` SDK and the Agents SDK parse.

The SDKs are the judges of the answers: they talk to the dialect through `httpx.MockTransport` (a
function from request to response at the HTTP seam), answered with `from_chat` JSON or with the
translator's bytes for a scripted chat completion and its vLLM-shaped chunks. Every answer is also
validated strictly against the SDK's pydantic models (the SDK itself builds them unvalidated). The
gateway's own route is tested through a real gateway elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from dialect_mutations import DELETE, mutated, paths
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from keraunos.gateway.dialects.base import Dialect, DialectRequestError
from keraunos.gateway.dialects.responses import RESPONSES

EVENTS = TypeAdapter(ResponseStreamEvent)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files. A FREEFORM tool: do not wrap the patch in JSON.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" LF'},
}
#: The tools as the SDK calls are given them (plain dicts, not the SDK's typed params).
TOOLS: Any = [WEATHER, PATCH]
BODY: dict[str, Any] = {"model": "agent-model", "input": "What is the weather in Paris?", "tools": TOOLS}


def _dialect(d: Dialect) -> Dialect:
    return d


# -- scripted chat answers, in vLLM's shapes -------------------------------------------------------


def completion(
    content: str | None = "Sunny, 21 degrees.",
    *,
    tool_calls: tuple[tuple[str, str, str], ...] = (),
    reasoning: str | None = None,
    finish: str = "stop",
    logprobs: list[dict[str, Any]] | None = None,
    completion_id: str = "chatcmpl-abc123",
) -> dict[str, Any]:
    """A chat completion as vLLM answers it; `tool_calls` are (id, name, arguments text)."""
    calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in tool_calls
    ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": 1767225600,
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
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": 40,
            "completion_tokens": 9,
            "total_tokens": 49,
            "prompt_tokens_details": {"cached_tokens": 32},
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks vLLM streams for `answer`: the role, reasoning and text in pieces (one logprob
    entry a piece when the answer has them), each tool call's id and name then its arguments in
    pieces, the finish, then the usage-only chunk."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"], "model": "m"}
    entries = list((choice["logprobs"] or {}).get("content") or [])

    def chunk(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": p}) for p in _pieces(message["reasoning_content"] or "", 3)]
    for piece in _pieces(message["content"] or "", 4):
        lp = {"content": [entries.pop(0)]} if entries else None
        out.append(chunk({"content": piece}, logprobs=lp))
    for index, call in enumerate(message["tool_calls"]):
        first = {"index": index, "id": call["id"], "type": "function"}
        out.append(
            chunk(
                {"tool_calls": [{**first, "function": {"name": call["function"]["name"], "arguments": ""}}]}
            )
        )
        for piece in _pieces(call["function"]["arguments"], 5):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, finish_reason=choice["finish_reason"]))
    out.append({**head, "choices": [], "usage": answer["usage"]})
    return out


def stream_bytes(body: dict[str, Any], answer: dict[str, Any]) -> bytes:
    translator = RESPONSES.translator(body)
    return b"".join(translator.feed(c) for c in chunks(answer)) + translator.finish()


def events(data: bytes) -> list[dict[str, Any]]:
    """The data of each SSE event, checking the framing `event: NAME\\ndata: JSON\\n\\n`."""
    assert data.endswith(b"\n\n")
    out = []
    for raw in data[:-2].split(b"\n\n"):
        name_line, data_line = raw.split(b"\n")
        assert name_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        payload = json.loads(data_line[6:])
        assert payload["type"] == name_line[7:].decode()
        out.append(payload)
    return out


class Engine:
    """The HTTP seam the SDKs call: converts each request and answers the next scripted completion."""

    def __init__(self, *answers: dict[str, Any], status: int = 200) -> None:
        self.answers = list(answers)
        self.status = status
        self.bodies: list[dict[str, Any]] = []
        self.chat_requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/proxy/rollout/r/attempt/a/mode/train/openai/v1/responses"
        body = json.loads(request.content)
        if self.status != 200:
            return httpx.Response(self.status, content=RESPONSES.error_body(self.status, "engine says no"))
        self.bodies.append(body)
        self.chat_requests.append(RESPONSES.to_chat(body))
        answer = self.answers[min(len(self.bodies), len(self.answers)) - 1]
        if body.get("stream"):
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=stream_bytes(body, answer)
            )
        return httpx.Response(200, json=RESPONSES.from_chat(body, answer))

    def _base_url(self) -> str:
        return "http://gateway.test/proxy/rollout/r/attempt/a/mode/train/openai/v1"

    def client(self) -> openai.OpenAI:
        transport = httpx.MockTransport(self)
        return openai.OpenAI(
            api_key="key",
            base_url=self._base_url(),
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )

    def async_client(self) -> openai.AsyncOpenAI:
        transport = httpx.MockTransport(self)
        return openai.AsyncOpenAI(
            api_key="key",
            base_url=self._base_url(),
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )


# -- requests --------------------------------------------------------------------------------------


def test_the_dialect_is_named_as_recorded_and_fits_the_seam() -> None:
    assert _dialect(RESPONSES).name == "openai.responses"


def test_instructions_and_a_string_input_become_a_system_and_a_user_message() -> None:
    chat = RESPONSES.to_chat({"model": "m", "instructions": "Be brief.", "input": "hi"})
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }


#: Codex CLI 0.171's first request, trimmed (as captured against a recording server).
CODEX_FIRST: dict[str, Any] = {
    "model": "test-model",
    "stream": True,
    "input": [
        {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
        {"type": "message", "id": "msg_3", "role": "user", "content": [{"type": "input_text", "text": "Write hello to out.txt"}]},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"], "additionalProperties": False}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [{"type": "function", "name": "spawn_agent", "strict": False, "parameters": {"type": "object", "properties": {}}}]},
        {"type": "web_search", "external_web_access": False},
        {"type": "tool_search", "execution": "client", "description": "Searches deferred tools.", "parameters": {"type": "object"}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a2345d-8589",
    "text": {"verbosity": "low"},
    "client_metadata": {"session_id": "01a2345d-8589", "x-codex-turn-metadata": "{}"},
}  # fmt: skip


def test_codex_clis_first_request_becomes_system_and_user_messages_with_its_function_tools() -> None:
    chat = RESPONSES.to_chat(CODEX_FIRST)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "<environment_context/>"},
        {"role": "user", "content": "Write hello to out.txt"},
    ]
    # The namespace's tools are offered flat; web search and tool search are not offered at all.
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["exec_command", "spawn_agent"]
    assert chat["tools"][0]["function"]["parameters"]["required"] == ["cmd"]
    assert chat["tools"][0]["function"]["strict"] is False
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("auto", True)
    assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})
    assert not {"reasoning", "store", "include", "client_metadata", "prompt_cache_key", "text"} & set(chat)


def test_a_call_and_its_output_become_an_assistant_tool_call_and_a_tool_message() -> None:
    second = {
        **CODEX_FIRST,
        "input": [
            *CODEX_FIRST["input"],
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "function_call", "status": "completed", "id": "fc_1", "name": "exec_command", "arguments": '{"cmd": "ls"}', "call_id": "call_01"},
            {"type": "function_call_output", "id": "fco_1", "call_id": "call_01", "output": "out.txt\n"},
        ],
    }  # fmt: skip
    messages = RESPONSES.to_chat(second)["messages"]
    assert messages[3:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_01",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_01", "content": "out.txt\n"},
    ]


def test_consecutive_calls_are_one_assistant_turn_with_the_text_just_before_them() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking ", "annotations": []}, {"type": "output_text", "text": "both."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "sunny"}]},
            {"type": "function_call_output", "call_id": "c2", "output": "rain"},
        ],
    }  # fmt: skip
    messages = RESPONSES.to_chat(body)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Checking both."
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert [m["content"] for m in messages[2:]] == ["sunny", "rain"]


def test_a_custom_tool_is_a_function_of_one_string_input_that_carries_its_grammar() -> None:
    chat = RESPONSES.to_chat(
        {
            "model": "m",
            "tools": [PATCH, {"type": "custom", "name": "note"}],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
            "input": [
                {"role": "user", "content": "Fix it."},
                {
                    "type": "custom_tool_call",
                    "call_id": "p1",
                    "name": "apply_patch",
                    "input": "*** Begin Patch\n",
                },
                {"type": "custom_tool_call_output", "call_id": "p1", "output": "Done!"},
            ],
        }
    )
    patch, note = chat["tools"]
    assert patch["function"]["name"] == "apply_patch"
    assert patch["function"]["description"] == PATCH["description"]
    parameters = patch["function"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["properties"]["input"]["type"] == "string"
    assert 'lark grammar:\nstart: "*** Begin Patch" LF' in parameters["properties"]["input"]["description"]
    assert note["function"]["parameters"]["properties"] == {"input": {"type": "string"}}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    call = chat["messages"][1]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"input": "*** Begin Patch\n"}
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": "p1", "content": "Done!"}


def test_images_become_image_url_parts_and_developer_messages_become_system_messages() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "developer", "content": "Rules."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low"},
                ],
            },
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot say."}]},
        ],
    }
    assert RESPONSES.to_chat(body)["messages"] == [
        {"role": "system", "content": "Rules."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "I cannot say."},
    ]


def test_sampling_limits_formats_and_logprobs_map_to_their_chat_names() -> None:
    chat = RESPONSES.to_chat(
        {
            **BODY,
            "max_output_tokens": 300,
            "temperature": 0.7,
            "top_p": 0.9,
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "text": {
                "format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}
            },
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "user": "u-1",
            "metadata": {"k": "v"},
            "truncation": "disabled",
            "service_tier": "auto",
            "safety_identifier": "s",
        }
    )
    assert {k: v for k, v in chat.items() if k not in ("messages", "tools")} == {
        "model": "agent-model",
        "max_tokens": 300,
        "temperature": 0.7,
        "top_p": 0.9,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}},
        "logprobs": True,
        "top_logprobs": 2,
        "user": "u-1",
    }  # fmt: skip
    assert RESPONSES.to_chat({**BODY, "text": {"format": {"type": "json_object"}}})["response_format"] == {
        "type": "json_object"
    }


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
        ({"input": [{"type": "local_shell_call", "id": "x"}]}, "input.0.type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0.type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input.0.content.0.file_id",
        ),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools.0.type"),
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools.0.type"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools.0.type"),
        ({"tools": [{"type": "mcp", "server_label": "s"}]}, "tools.0.type"),
        ({"tools": [{"type": "local_shell"}]}, "tools.0.type"),
        ({"tools": [{"type": "image_generation"}]}, "tools.0.type"),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.name"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        ({"model": 3}, "model"),
        ({"input": None}, "input"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input.0.role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_a_body_the_gateway_cannot_serve_is_a_400_naming_the_offending_field(
    change: dict[str, Any], param: str
) -> None:
    with pytest.raises(DialectRequestError) as raised:
        RESPONSES.to_chat({**BODY, **change})
    assert (raised.value.status, raised.value.param) == (400, param)
    assert raised.value.message.startswith(f"{param}: ")


def test_a_hosted_tool_is_refused_by_its_type_name_and_stateful_fields_say_to_send_the_whole_input() -> None:
    with pytest.raises(DialectRequestError, match="'file_search' tools are run by OpenAI's servers"):
        RESPONSES.to_chat({**BODY, "tools": [{"type": "file_search"}]})
    with pytest.raises(DialectRequestError, match="send the whole conversation in `input`"):
        RESPONSES.to_chat({**BODY, "previous_response_id": "resp_1"})


# -- answers ---------------------------------------------------------------------------------------


def test_a_text_answer_is_a_completed_response_under_the_requested_model_with_ids_from_the_completion() -> (
    None
):
    response = RESPONSES.from_chat(BODY, completion())
    Response.model_validate(response)  # every field the SDK's model requires, with its types
    assert (response["id"], response["object"], response["status"]) == (
        "resp_abc123",
        "response",
        "completed",
    )
    assert (response["model"], response["created_at"]) == ("agent-model", 1767225600)
    assert response["output"] == [
        {
            "id": "msg_abc123",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Sunny, 21 degrees.", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert response["tools"] == BODY["tools"] and response["error"] is None
    assert response["usage"] == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 32, "cache_write_tokens": 0},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 49,
    }


def test_reasoning_text_and_calls_become_items_in_that_order_with_the_chat_call_ids() -> None:
    answer = completion(
        "Let me check.",
        reasoning="The user wants weather.",
        tool_calls=(("call_1", "get_weather", '{"city": "Paris"}'), ("call_2", "apply_patch", '{"input": "*** Begin Patch\\n"}')),
        finish="tool_calls",
    )  # fmt: skip
    response = RESPONSES.from_chat(BODY, answer)
    Response.model_validate(response)
    reasoning, message, call, patch = response["output"]
    assert reasoning == {
        "id": "rs_abc123",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "The user wants weather."}],
        "status": "completed",
    }
    assert message["id"] == "msg_abc123"
    assert call == {
        "id": "fc_abc123_0",
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
        "status": "completed",
    }
    assert patch == {
        "id": "ctc_abc123_1",
        "type": "custom_tool_call",
        "call_id": "call_2",
        "name": "apply_patch",
        "input": "*** Begin Patch\n",
    }


def test_a_call_of_a_namespaced_tool_carries_its_namespace_so_codex_can_dispatch_it() -> None:
    answer = completion(None, tool_calls=(("c", "spawn_agent", "{}"),), finish="tool_calls")
    (call,) = RESPONSES.from_chat(CODEX_FIRST, answer)["output"]
    assert (call["name"], call["namespace"]) == ("spawn_agent", "multi_agent_v1")


def test_a_custom_call_whose_arguments_are_not_the_input_json_passes_the_raw_text_on() -> None:
    answer = completion(None, tool_calls=(("c", "apply_patch", "*** Begin Patch"),), finish="tool_calls")
    (call,) = RESPONSES.from_chat(BODY, answer)["output"]
    assert call["input"] == "*** Begin Patch"


@pytest.mark.parametrize(
    ("finish", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_an_answer_cut_short_is_incomplete_with_the_reason_and_its_last_item_incomplete(
    finish: str, reason: str
) -> None:
    response = RESPONSES.from_chat(BODY, completion("Sunny and", reasoning="r", finish=finish))
    Response.model_validate(response)
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": reason})
    assert [item["status"] for item in response["output"]] == ["completed", "incomplete"]


def test_the_engines_logprobs_are_carried_on_the_output_text_with_their_bytes_when_the_agent_asks() -> None:
    entries = [
        {
            "token": "Sun",
            "logprob": -0.5,
            "bytes": [83, 117, 110],
            "top_logprobs": [{"token": "Sun", "logprob": -0.5}],
        },
        {"token": "ny", "logprob": -0.1, "top_logprobs": []},
    ]
    # Unasked (the proxy forces log probs in train mode for the record), the answer has none.
    unasked = RESPONSES.from_chat(BODY, completion("Sunny", logprobs=entries))
    assert unasked["output"][0]["content"][0]["logprobs"] == []
    stream = RESPONSES.translator(BODY)
    streamed = b"".join(stream.feed(c) for c in chunks(completion("Sunny", logprobs=entries)))
    assert b'"logprobs":[{' not in streamed + stream.finish()
    asked = {**BODY, "include": ["message.output_text.logprobs"]}
    response = RESPONSES.from_chat(asked, completion("Sunny", logprobs=entries))
    Response.model_validate(response)
    assert response["output"][0]["content"][0]["logprobs"] == [
        {"token": "Sun", "bytes": [83, 117, 110], "logprob": -0.5, "top_logprobs": [{"token": "Sun", "bytes": [83, 117, 110], "logprob": -0.5}]},
        {"token": "ny", "bytes": [110, 121], "logprob": -0.1, "top_logprobs": []},
    ]  # fmt: skip


def test_the_sdk_parses_text_function_and_custom_calls_and_the_usage() -> None:
    answer = completion(
        "On it.",
        tool_calls=(
            ("call_1", "get_weather", '{"city": "Paris"}'),
            ("call_2", "apply_patch", '{"input": "patch"}'),
        ),
        finish="tool_calls",
    )
    engine = Engine(answer)
    response = engine.client().responses.create(model="agent-model", input="Weather?", tools=TOOLS)
    assert response.output_text == "On it."
    _, call, patch = response.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    assert patch.type == "custom_tool_call" and (patch.call_id, patch.input) == ("call_2", "patch")
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 32
    assert engine.chat_requests[0]["messages"] == [{"role": "user", "content": "Weather?"}]


def test_the_sdk_reads_an_answer_cut_at_max_output_tokens_as_incomplete() -> None:
    engine = Engine(completion("Sunny a", finish="length"))
    response = engine.client().responses.create(model="agent-model", input="Weather?", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert engine.chat_requests[0]["max_tokens"] == 3


# -- streaming -------------------------------------------------------------------------------------

EVERYTHING = completion(
    "Let me check.",
    reasoning="Weather, then a patch.",
    tool_calls=(("call_1", "get_weather", '{"city": "Paris"}'), ("call_2", "apply_patch", '{"input": "*** Begin Patch\\n"}')),
    finish="tool_calls",
    logprobs=[{"token": "Let", "logprob": -0.2, "top_logprobs": []}],
)  # fmt: skip


def test_a_stream_is_the_sdks_event_sequence_with_the_ids_of_the_completed_response() -> None:
    streamed = events(stream_bytes(BODY, EVERYTHING))
    for event in streamed:
        EVENTS.validate_python(event)  # strictly one of the SDK's typed events
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    kinds = [e["type"] for e in streamed]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    item_events = [k for k in kinds[2:-1] if "delta" not in k]
    assert item_events == [
        *("response.output_item.added", "response.content_part.added"),
        *("response.reasoning_text.done", "response.content_part.done", "response.output_item.done"),
        *("response.output_item.added", "response.content_part.added"),
        *("response.output_text.done", "response.content_part.done", "response.output_item.done"),
        *("response.output_item.added", "response.function_call_arguments.done", "response.output_item.done"),
        *("response.output_item.added", "response.custom_tool_call_input.done", "response.output_item.done"),
    ]
    assert {k for k in kinds if "delta" in k} == {
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
    final = streamed[-1]["response"]
    assert final == RESPONSES.from_chat(BODY, EVERYTHING)
    added = [e["item"]["id"] for e in streamed if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in streamed if e["type"] == "response.output_item.done"]
    assert added == [item["id"] for item in done] == [item["id"] for item in final["output"]]
    assert done == final["output"]
    assert {e["item_id"] for e in streamed if "item_id" in e} == set(added)
    assert streamed[0]["response"]["id"] == final["id"] == "resp_abc123"


@pytest.mark.parametrize(
    "answer",
    [
        completion(),
        completion(
            "Checking.", tool_calls=(("call_1", "get_weather", '{"city": "Paris"}'),), finish="tool_calls"
        ),
        completion(
            None, reasoning="hmm", tool_calls=(("c", "apply_patch", '{"input": "p"}'),), finish="tool_calls"
        ),
    ],
    ids=["text", "function-call", "reasoning-and-custom-call"],
)
def test_the_sdks_final_streamed_response_equals_the_unstreamed_one(answer: dict[str, Any]) -> None:
    client = Engine(answer).client()
    whole = client.responses.parse(model="agent-model", input="Weather?", tools=TOOLS)
    with client.responses.stream(model="agent-model", input="Weather?", tools=TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed"
    assert final.model_dump() == whole.model_dump()


def test_the_sdk_stream_yields_typed_deltas_and_the_completed_response_carries_the_last_chunks_usage() -> (
    None
):
    client = Engine(EVERYTHING).client()
    stream = client.responses.create(model="agent-model", input="Weather?", tools=TOOLS, stream=True)
    received = list(stream)
    text = "".join(e.delta for e in received if e.type == "response.output_text.delta")
    assert text == "Let me check."
    completed = received[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None and completed.response.usage.total_tokens == 49


def test_a_stream_cut_at_the_length_limit_ends_with_response_incomplete() -> None:
    streamed = events(stream_bytes(BODY, completion("Sunny a", finish="length")))
    last = streamed[-1]
    assert last["type"] == "response.incomplete"
    EVENTS.validate_python(last)
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [e["item"]["status"] for e in streamed if e["type"] == "response.output_item.done"] == [
        "incomplete"
    ]


@pytest.mark.parametrize("after", [0, 3], ids=["before-any-chunk", "mid-text"])
def test_a_failed_stream_ends_with_response_failed_carrying_a_server_error(after: int) -> None:
    translator = RESPONSES.translator(BODY)
    data = b"".join(translator.feed(c) for c in chunks(completion())[:after])
    data += translator.fail("upstream: engine closed the connection", source="upstream")
    streamed = events(data)
    for event in streamed:
        EVENTS.validate_python(event)
    assert streamed[0]["type"] == "response.created"
    failed = streamed[-1]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": "upstream: engine closed the connection",
    }
    assert failed["response"]["id"] == streamed[0]["response"]["id"]


def test_an_error_answer_has_openais_shape_and_the_sdk_raises_its_status_error() -> None:
    body = json.loads(RESPONSES.error_body(400, "input.0.type: nope", code="invalid_value"))
    assert body["error"] == {
        "message": "input.0.type: nope",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_value",
        "source": "gateway",
        "attempts": 0,
    }
    with pytest.raises(openai.BadRequestError, match="engine says no"):
        Engine(completion(), status=400).client().responses.create(model="m", input="hi")


# -- the OpenAI Agents SDK on its default model class ----------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_an_agents_sdk_agent_calls_its_function_tool_and_reads_the_final_output(streamed: bool) -> None:
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"{city}: sunny, 21 degrees"

    engine = Engine(
        completion(None, tool_calls=(("call_7", "get_weather", '{"city": "Paris"}'),), finish="tool_calls"),
        completion("It is sunny in Paris.", completion_id="chatcmpl-second"),
    )
    model = OpenAIResponsesModel(model="agent-model", openai_client=engine.async_client())
    agent = Agent(name="forecaster", instructions="Answer with the tool.", tools=[get_weather], model=model)

    async def run() -> Any:
        if not streamed:
            return (await Runner.run(agent, "Weather in Paris?")).final_output
        result = Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run()) == "It is sunny in Paris."
    assert asked == ["Paris"]
    first, second = engine.chat_requests
    assert first["messages"][0] == {"role": "system", "content": "Answer with the tool."}
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_7"
    assert second["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_7",
        "content": "Paris: sunny, 21 degrees",
    }


# -- properties ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)
api_keys = st.sampled_from(
    [
        "model", "input", "instructions", "tools", "tool_choice", "type", "role", "content", "text", "name",
        "call_id", "arguments", "output", "parameters", "format", "image_url", "file_id", "include",
        "max_output_tokens", "stream", "background", "previous_response_id", "top_logprobs", "truncation",
    ]
)  # fmt: skip
json_objects = st.dictionaries(api_keys | st.text(max_size=6), json_values, max_size=8)

VALID: dict[str, Any] = {
    "model": "m",
    "instructions": "sys",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "go"}, {"type": "input_image", "image_url": "u"}]},
        {"type": "reasoning", "id": "rs", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": [{"type": "input_text", "text": "r"}]},
        {"type": "custom_tool_call", "call_id": "b", "name": "apply_patch", "input": "p"},
        {"type": "custom_tool_call_output", "call_id": "b", "output": "done"},
    ],
    "tools": [WEATHER, PATCH, {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "parallel_tool_calls": True,
    "max_output_tokens": 64,
    "temperature": 1,
    "top_p": 0.5,
    "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": True}},
    "include": ["message.output_text.logprobs"],
    "top_logprobs": 1,
    "reasoning": {"effort": "low"},
    "metadata": {"k": "v"},
    "truncation": "auto",
    "user": "u",
    "stream": True,
}  # fmt: skip


VALID_PATHS = [p for p in paths(VALID) if p]


def test_the_valid_body_the_mutations_start_from_converts() -> None:
    chat = RESPONSES.to_chat(VALID)
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]


deterministic = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow],
)


@deterministic
@given(json_objects)
def test_any_json_object_converts_or_is_refused_with_a_dialect_error(body: dict[str, Any]) -> None:
    try:
        assert isinstance(RESPONSES.to_chat(body), dict)
    except DialectRequestError as error:
        assert error.status == 400 and error.message


@deterministic
@given(st.sampled_from(VALID_PATHS), st.just(DELETE) | json_values)
def test_a_valid_body_with_any_one_part_replaced_or_removed_converts_or_is_refused(
    path: tuple[Any, ...], replacement: Any
) -> None:
    try:
        chat = RESPONSES.to_chat(mutated(VALID, path, replacement))
    except DialectRequestError as error:
        assert error.status == 400 and error.message.startswith(f"{error.param}: ")
        return
    assert isinstance(chat, dict) and chat["messages"]


def _maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


tool_call_deltas = _maybe(
    index=st.integers(0, 2) | json_values,
    id=st.text(max_size=4) | json_values,
    function=_maybe(
        name=st.sampled_from(["get_weather", "apply_patch"]) | json_values,
        arguments=st.text(max_size=6) | json_values,
    )
    | json_values,
)
chat_chunks = json_objects | _maybe(
    id=json_values,
    created=json_values,
    usage=_maybe(prompt_tokens=json_values, completion_tokens=json_values, prompt_tokens_details=json_values)
    | json_values,
    choices=st.lists(
        _maybe(
            index=st.just(0) | json_values,
            delta=_maybe(
                content=st.text(max_size=4) | json_values,
                reasoning_content=st.text(max_size=4) | json_values,
                refusal=st.text(max_size=4) | json_values,
                tool_calls=st.lists(tool_call_deltas, max_size=2) | json_values,
            )
            | json_values,
            logprobs=_maybe(content=st.lists(_maybe(token=json_values, logprob=json_values), max_size=2))
            | json_values,
            finish_reason=st.sampled_from(["stop", "length", "tool_calls"]) | json_values,
        )
        | json_values,
        max_size=2,
    )
    | json_values,
)


@settings(deterministic, max_examples=200)
@given(st.lists(chat_chunks, max_size=6), st.booleans())
def test_any_chunks_become_numbered_events_ending_in_a_final_response_without_raising(
    stream: list[dict[str, Any]], fails: bool
) -> None:
    translator = RESPONSES.translator(BODY)
    data = b"".join(translator.feed(chunk) for chunk in stream)
    data += translator.fail("boom", source="gateway") if fails else translator.finish()
    streamed = events(data)
    assert [e["sequence_number"] for e in streamed] == list(range(len(streamed)))
    assert streamed[-1]["type"] in (
        {"response.failed"} if fails else {"response.completed", "response.incomplete"}
    )


answers = st.builds(
    lambda content, reasoning, calls, finish: completion(
        content, reasoning=reasoning, tool_calls=tuple(calls), finish=finish
    ),
    st.none() | st.text(max_size=12),
    st.none() | st.text(max_size=8),
    st.lists(
        st.tuples(
            st.text("abc", min_size=1, max_size=3),
            st.sampled_from(["get_weather", "apply_patch"]),
            st.text(max_size=14),
        ),
        max_size=3,
    ),
    st.sampled_from(["stop", "length", "tool_calls"]),
)


@deterministic
@given(answers)
def test_any_answer_streamed_completes_as_the_same_response_as_unstreamed_with_items_as_streamed(
    answer: dict[str, Any],
) -> None:
    streamed = events(stream_bytes(BODY, answer))
    final = streamed[-1]["response"]
    assert final == RESPONSES.from_chat(BODY, answer)
    Response.model_validate(final)
    assert [e["item"] for e in streamed if e["type"] == "response.output_item.done"] == final["output"]


def test_a_text_chunk_makes_the_same_event_bytes_on_the_fast_path_as_through_the_general_one() -> None:
    # The usual chunk (a text delta alone) is written without building its event's dict; a delta
    # with one more key (`"role": None`) goes the general way: the bytes must not differ.
    answer = completion("Sunny and warm, 21 degrees, a light wind from the west.")
    plain = chunks(answer)
    padded = [
        {**c, "choices": [{**ch, "delta": {**ch["delta"], "role": None}} for ch in c["choices"]]}
        if c.get("choices") and "content" in c["choices"][0].get("delta", {})
        else c
        for c in plain
    ]
    fast, general = RESPONSES.translator(BODY), RESPONSES.translator(BODY)
    assert (
        b"".join(fast.feed(c) for c in plain) + fast.finish()
        == b"".join(general.feed(c) for c in padded) + general.finish()
    )

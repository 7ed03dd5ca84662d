"""The official SDKs as conformance clients of the Messages and Responses routes (issue 20): the
`anthropic` SDK, the `openai` SDK's Responses API and the OpenAI Agents SDK on its default model
class, each through a real gateway in front of the scripted engine stand-in, which answers the
first call with a tool call and a call carrying the tool's result with text. Streamed and not; the
tool round trip, the events each SDK folds, the record and the training row.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest
from harness_support import StartStage

pytestmark = pytest.mark.timeout(120)

FINAL = "It is sunny in Paris."
SCRIPT = [
    {"when": {"role": "tool"}, "reply": {"text": FINAL}},
    {"reply": {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}},
]
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def assert_recorded_as_one_row(stage: Any, api: str) -> None:
    calls = stage.model_calls()
    assert [call["api"] for call in calls] == [api, api]
    assert all(call["status"] == "ok" and not call.get("side_call") for call in calls)
    assert calls[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    built = stage.rows()
    assert built.breaks == [] and len(built.rows) == 1 and built.rows.n_calls.tolist() == [2]


@pytest.mark.parametrize("streamed", [False, True])
def test_the_anthropic_sdk_calls_a_tool_and_finishes_through_the_gateway(
    stage: StartStage, streamed: bool
) -> None:
    on = stage(SCRIPT)
    client = anthropic.Anthropic(
        base_url=on.prefix("anthropic"), api_key=on.agent_token, max_retries=0, timeout=60
    )
    tools = [{"name": "get_weather", "description": "The weather of a city.", "input_schema": WEATHER_SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]

    def ask() -> anthropic.types.Message:
        if not streamed:
            return client.messages.create(
                model="claude-sonnet-4-5", max_tokens=64, tools=tools, messages=messages
            )  # type: ignore[arg-type]
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=64, tools=tools, messages=messages
        ) as s:  # type: ignore[arg-type]
            kinds = {event.type for event in s}
            assert {
                "message_start",
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop",
            } <= kinds
            return s.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    [use] = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}],
        },
    ]
    second = ask()
    assert second.stop_reason == "end_turn"
    assert "".join(block.text for block in second.content if block.type == "text") == FINAL
    assert_recorded_as_one_row(on, "anthropic.messages")


@pytest.mark.parametrize("streamed", [False, True])
def test_the_openai_sdk_responses_api_calls_a_function_and_finishes_through_the_gateway(
    stage: StartStage, streamed: bool
) -> None:
    on = stage(SCRIPT)
    client = openai.OpenAI(base_url=f"{on.prefix('openai')}/v1", api_key=on.agent_token, max_retries=0)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA, "strict": False}]
    items: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]

    def ask() -> Any:
        if not streamed:
            return client.responses.create(model="gpt-5", input=items, tools=tools, store=False)  # type: ignore[arg-type]
        events = list(
            client.responses.create(model="gpt-5", input=items, tools=tools, store=False, stream=True)
        )  # type: ignore[arg-type]
        kinds = [event.type for event in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        final = events[-1].response  # type: ignore[union-attr]
        added = [e.item.id for e in events if e.type == "response.output_item.added"]  # type: ignore[union-attr]
        done = [e.item.id for e in events if e.type == "response.output_item.done"]  # type: ignore[union-attr]
        assert added == done == [item.id for item in final.output]
        return final

    first = ask()
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.arguments and "Paris" in call.arguments
    items += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    second = ask()
    assert second.output_text == FINAL and second.status == "completed"
    assert_recorded_as_one_row(on, "openai.responses")


def test_the_openai_agents_sdk_on_its_default_model_runs_a_tool_and_answers_through_the_gateway(
    stage: StartStage,
) -> None:
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled

    on = stage(SCRIPT)
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI otherwise
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        asked.append(city)
        return "sunny, 21 C"

    client = openai.AsyncOpenAI(base_url=f"{on.prefix('openai')}/v1", api_key=on.agent_token, max_retries=0)
    model = OpenAIResponsesModel(model="gpt-5", openai_client=client)  # the SDK's default model class
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model)

    async def run() -> Any:
        try:
            return await Runner.run(agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()

    result = asyncio.run(run())
    assert asked == ["Paris"] and result.final_output == FINAL
    assert_recorded_as_one_row(on, "openai.responses")

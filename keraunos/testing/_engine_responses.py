"""The engine stand-in's Responses API, served natively as vLLM (0.32) serves it to a model without
reasoning or tool parsers: the answer is made from the chat answer to the body's chat form, and
`enable_response_messages` adds the prompt's and the output's token ids as `input_messages` and
`output_messages` (`[{message, tokens, type: raw_message_tokens}]`). Streamed, the events end with
`response.completed` carrying the same; there is no `data: [DONE]`.

For the gateway's native path (docs/harnesses.md#native-responses); the real engine's answers are
held to the same shape by tests/vllm/test_vllm_native_responses.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from keraunos.gateway.dialects.responses import ResponsesStream, from_chat, to_chat


def chat_request(body: Any) -> dict[str, Any]:
    """The chat request the stand-in generates for a Responses `body` (ids always returned);
    raises `DialectRequestError` for a body it cannot read."""
    chat = to_chat(body)
    chat["return_token_ids"] = True
    return chat


def answer(body: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """The unstreamed Responses answer to `body` from the stand-in's chat `completion`."""
    out = from_chat(body, completion)
    if body.get("enable_response_messages") is True:
        out.update(_messages(completion))
    return out


def events(body: dict[str, Any], completion: dict[str, Any]) -> bytes:
    """The streamed answer: the Responses events of the completion sent as one chat delta."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"]}
    stream = ResponsesStream(body)
    out = stream.feed({**head, "choices": [{"index": 0, "delta": delta, "logprobs": choice.get("logprobs")}]})
    out += stream.feed(
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    )
    out += stream.feed({**head, "choices": [], "usage": completion["usage"]})
    closing = stream.finish()
    if body.get("enable_response_messages") is not True:
        return out + closing
    kept = []
    for event in closing.split(b"\n\n"):
        name, _, data = event.partition(b"\ndata: ")
        if name.endswith((b"response.completed", b"response.incomplete")):
            parsed = orjson.loads(data)
            parsed["response"].update(_messages(completion))
            event = name + b"\ndata: " + orjson.dumps(parsed)
        kept.append(event)
    return out + b"\n\n".join(kept)


def _messages(completion: dict[str, Any]) -> dict[str, Any]:
    choice = completion["choices"][0]
    text = choice["message"].get("content") or ""
    return {
        "input_messages": [
            {"message": "", "tokens": completion["prompt_token_ids"], "type": "raw_message_tokens"}
        ],
        "output_messages": [{"message": text, "tokens": choice["token_ids"], "type": "raw_message_tokens"}],
    }

"""Realistic `model_request` event data of a multi-turn agent rollout served by vLLM.

`growing_prefix_rollout` builds what the gateway records for each call of an agent that talks to a
vLLM chat endpoint with `logprobs`, `top_logprobs` and `return_token_ids`: call k+1's prompt ids are
call k's prompt ids + its response ids + the ids of the tool observation, and its request messages
are call k's plus the assistant reply and the tool message. Everything is drawn from a seeded
`random.Random`, so the same arguments give the same data on every machine.
"""

from __future__ import annotations

import random
from typing import Any

MODEL = "Qwen/Qwen3-8B"
ENDPOINT = "http://10.0.0.7:8000/v1"
MODEL_VERSION = 3
VOCAB_SIZE = 151_936

# Words of an agent's English and Python, each a token with and without a leading space.
_WORD_TEXT = """
the of and to in is that for it as with was on be by this are or from at an which have not agent
tool call file line error test value return function class import def self list dict run output
result state step reward model token prompt data path True False None if else for while try except
raise print len range open read write json config server client
"""
_SYMBOLS = ("(", ")", ":", ",", ".", "_", "=", "==", "->", "[", "]", "{", "}", '"', "'", "\n", "\n\n", "    ")
_FOREIGN = ("über", "café", "naïve", "déjà", "日本", "語", "東京", "Привет", "мир", "ñ", "€", "→", "🙂", "🚀")
# Byte-level BPE tokens that end inside a multi-byte character: vLLM shows them as U+FFFD and gives
# their real bytes, which are not the UTF-8 of the text.
_PARTIAL_BYTES = ((0xE6,), (0x97, 0xA5), (0xE8, 0xAA), (0x9E,), (0xF0, 0x9F), (0x99, 0x82))


def growing_prefix_rollout(
    n_calls: int,
    *,
    seed: int = 0,
    initial_prompt: int = 1024,
    response_tokens: int = 128,
    observation_tokens: int = 50,
    top_logprobs: int = 5,
) -> list[dict[str, Any]]:
    """`model_request` data of `n_calls` consecutive chat calls of one rollout, oldest first.

    Each call's request carries the whole history (system, user, then per turn the assistant reply
    and a tool message); its response has top-level `prompt_token_ids`, `choices[0]` with message,
    `token_ids` and `logprobs.content` (`top_logprobs` alternatives per position), and usage. Id
    lists are fresh per call; message objects are shared between calls, as a history would be.
    """
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software agent. " + _text(rng, vocabulary, 60)},
        {"role": "user", "content": _text(rng, vocabulary, 120)},
    ]
    prompt = [rng.randrange(VOCAB_SIZE) for _ in range(initial_prompt)]
    calls: list[dict[str, Any]] = []
    for turn in range(n_calls):
        content = [_logprob_entry(rng, vocabulary, top_logprobs) for _ in range(response_tokens)]
        token_ids = [entry.pop("_id") for entry in content]
        text = "".join(entry["token"] for entry in content)
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(token_ids),
            "completion_tokens": len(token_ids),
            "prompt_tokens_details": None,
        }
        response = {
            "id": f"chatcmpl-{rng.getrandbits(64):016x}",
            "object": "chat.completion",
            "created": 1_750_000_000 + 7 * turn,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning_content": None,
                    },
                    "logprobs": {"content": content},
                    "finish_reason": "stop",
                    "stop_reason": None,
                    "token_ids": token_ids,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt,
            "kv_transfer_params": None,
        }
        request = {
            "model": MODEL,
            "messages": list(messages),
            "temperature": 1.0,
            "top_p": 1.0,
            "max_tokens": response_tokens,
            "logprobs": True,
            "top_logprobs": top_logprobs,
            "return_token_ids": True,
        }
        calls.append(
            {
                "model": MODEL,
                "model_version": MODEL_VERSION,
                "request": request,
                "response": response,
                "server": {"model": MODEL, "endpoint": ENDPOINT, "version": MODEL_VERSION},
                "latency_ms": rng.uniform(200.0, 4000.0),
                "http_status": 200,
                "status": "ok",
                "retry_count": 0,
                "usage": dict(usage),
                "finish_reason": "stop",
            }
        )
        observation = [rng.randrange(VOCAB_SIZE) for _ in range(observation_tokens)]
        messages = [
            *messages,
            {"role": "assistant", "content": text},
            {
                "role": "tool",
                "tool_call_id": f"call_{turn}",
                "content": _text(rng, vocabulary, observation_tokens),
            },
        ]
        prompt = prompt + token_ids + observation
    return calls


def distinct_content_bytes(calls: list[dict[str, Any]]) -> int:
    """The information a rollout of `growing_prefix_rollout` shape really holds, in bytes.

    4 bytes per token id not already in the previous call's prompt + response, 8 per log prob
    (chosen and top), the UTF-8 of every log-prob token string, and the UTF-8 of every distinct
    message text (request messages and response message). A store should stay within a small
    factor of it; a store that repeats prompts and histories grows quadratically past it.
    """
    total = 0
    previous: list[int] = []
    seen_texts: set[str] = set()
    for data in calls:
        response = data["response"]
        choice = response["choices"][0]
        prompt = response.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        token_ids = choice.get("token_ids") or []
        total += 4 * (len(prompt) - _common_prefix(prompt, previous) + len(token_ids))
        previous = prompt + token_ids
        for entry in (choice.get("logprobs") or {}).get("content") or []:
            for item in (entry, *entry["top_logprobs"]):
                total += 8 + len(item["token"].encode("utf-8"))
        for message in (*data["request"]["messages"], choice["message"]):
            text = message.get("content")
            if isinstance(text, str) and text not in seen_texts:
                seen_texts.add(text)
                total += len(text.encode("utf-8"))
    return total


def _vocabulary(rng: random.Random) -> list[tuple[str, list[int]]]:
    """Token strings with their bytes, a few of them partial characters."""
    words = _WORD_TEXT.split()
    pieces = [*words, *(w.capitalize() for w in words), *_FOREIGN]
    tokens = [piece for word in pieces for piece in (word, " " + word)]
    tokens += _SYMBOLS
    tokens += [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
        for _ in range(600)
    ]
    tokens += [str(n) for n in range(100)]
    vocabulary = [(token, list(token.encode("utf-8"))) for token in tokens]
    vocabulary += [("\ufffd", list(raw)) for raw in _PARTIAL_BYTES]
    rng.shuffle(vocabulary)
    return vocabulary


def _text(rng: random.Random, vocabulary: list[tuple[str, list[int]]], n_tokens: int) -> str:
    return "".join(rng.choice(vocabulary)[0] for _ in range(n_tokens))


def _logprob_entry(rng: random.Random, vocabulary: list[tuple[str, list[int]]], top_k: int) -> dict[str, Any]:
    """One `logprobs.content` entry (plus its token id under "_id"), vLLM-ordered keys."""
    logprob = -rng.expovariate(4.0)
    alternatives = []
    for _ in range(top_k):
        token_id = rng.randrange(VOCAB_SIZE)
        token, raw = vocabulary[token_id % len(vocabulary)]
        alternatives.append({"token": token, "logprob": logprob, "bytes": list(raw), "_id": token_id})
        logprob -= rng.expovariate(1.5)
    if alternatives and rng.random() < 0.85:
        chosen = dict(alternatives[0 if rng.random() < 0.7 else rng.randrange(top_k)])
    else:
        token_id = rng.randrange(VOCAB_SIZE)
        token, raw = vocabulary[token_id % len(vocabulary)]
        chosen = {
            "token": token,
            "logprob": logprob - rng.expovariate(1.0),
            "bytes": list(raw),
            "_id": token_id,
        }
    for alternative in alternatives:
        del alternative["_id"]
    return {
        "token": chosen["token"],
        "logprob": chosen["logprob"],
        "bytes": list(chosen["bytes"]),
        "top_logprobs": alternatives,
        "_id": chosen["_id"],
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n

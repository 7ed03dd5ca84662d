"""The event codec: exact round trips of any JSON data, compact chains of model calls, fast triplets."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keraunos.ledger.codec import (
    CallContext,
    CodecError,
    decode_json,
    decode_model_request,
    decode_model_request_triplet,
    encode_json,
    encode_model_request,
)
from keraunos.ledger.codec._triplet import trim_model_request
from keraunos.testing.calls import distinct_content_bytes, growing_prefix_rollout

SMALL = {"initial_prompt": 40, "response_tokens": 6, "observation_tokens": 3, "top_logprobs": 2}
_NO_PROMPT = {"response_tokens": 6, "observation_tokens": 3, "top_logprobs": 2}

# -- exactness helpers ------------------------------------------------------------------------------


def assert_same(a: Any, b: Any, path: str = "$") -> None:
    """Deep equality that also checks types, key order and float bits (any NaN equals any NaN)."""
    # The stdlib's JSON text tells apart exactly what must stay apart (1, 1.0 and true; -0.0 and
    # 0.0; NaN and null; key orders) and is fast; walk the values only to say where they differ.
    if json.dumps(a) != json.dumps(b):
        _assert_same_walk(a, b, path)
        raise AssertionError(f"{path}: {a!r} and {b!r} differ as JSON text")


def _assert_same_walk(a: Any, b: Any, path: str) -> None:
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float):
        if math.isnan(a):
            assert math.isnan(b), f"{path}: {a!r} != {b!r}"
        else:
            assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            _assert_same_walk(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_walk(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_triplet(fast: dict[str, Any], reference: dict[str, Any]) -> None:
    """The fast triplet equals the reference trim, numpy arrays compared as the lists they stand for."""
    assert list(fast) == list(reference)
    for key, value in fast.items():
        if key == "choices":  # n > 1: every choice's ids and log probs, checked the same way
            assert len(value) == len(reference[key])
            for choice, expected in zip(value, reference[key], strict=True):
                assert_same_triplet(choice, expected)
            continue
        if isinstance(value, np.ndarray):
            expected_kind = "f" if key == "response_log_probs" else "i"
            assert value.dtype.kind == expected_kind and value.dtype.itemsize in (4, 8), (key, value.dtype)
            value = value.tolist()
        assert_same(value, reference[key], f"$.{key}")


def assert_same_context(a: CallContext, b: CallContext) -> None:
    for name in ("prompt", "response"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.messages == b.messages
    assert (a.message_values is None) == (b.message_values is None)
    if a.message_values is not None:
        assert_same(a.message_values, b.message_values)


def round_trip_chain(calls: list[dict[str, Any]]) -> list[bytes]:
    """Encode `calls` as one attempt's chain, check every decode against them, return the blobs."""
    originals = copy.deepcopy(calls)
    blobs, contexts = [], []
    ctx: CallContext | None = None
    for data in calls:
        blob, ctx = encode_model_request(data, ctx)
        blobs.append(blob)
        contexts.append(ctx)
    for data, original in zip(calls, originals, strict=True):
        assert_same(data, original)  # encoding leaves its input alone

    full_ctx: CallContext | None = None
    triplet_ctx: CallContext | None = None
    for data, blob, written_ctx in zip(calls, blobs, contexts, strict=True):
        decoded, full_ctx = decode_model_request(blob, full_ctx)
        assert_same(decoded, data)
        assert_same_context(full_ctx, written_ctx)
        triplet, triplet_ctx = decode_model_request_triplet(blob, triplet_ctx)
        assert_same_triplet(triplet, trim_model_request(data))
        assert_same_context(triplet_ctx, written_ctx)
    return blobs


# -- strategies -------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**100), max_value=2**100),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.floats(),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1e308]),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)
id_items = st.one_of(
    st.integers(min_value=0, max_value=200_000),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([True, False, 2**63, 2**64, 1.0, None, "7"]),
)
id_lists = st.one_of(
    st.lists(st.integers(min_value=0, max_value=200_000), max_size=30),
    st.lists(id_items, max_size=8),
    json_values,
)
float_lists = st.one_of(st.lists(st.floats(), max_size=6), st.lists(json_scalars, max_size=4), json_values)


@st.composite
def logprob_items(draw: st.DrawFn, top: bool = False) -> Any:
    token = draw(st.text(max_size=4) | st.sampled_from(["\ufffd", "\ud800", 7]))
    raw = draw(
        st.one_of(
            st.just("utf8"),
            st.none(),
            st.lists(st.integers(min_value=0, max_value=255), max_size=3),
            st.sampled_from([[300], [True], [1.0]]),
        )
    )
    item: dict[str, Any] = {
        "token": token,
        "logprob": draw(st.floats() | st.sampled_from([None, -1, "0.5"])),
        "bytes": list(token.encode("utf-8", "surrogatepass"))
        if raw == "utf8" and isinstance(token, str)
        else raw,
    }
    if not top:
        item["top_logprobs"] = draw(st.lists(logprob_items(top=True), max_size=3) | json_values)
    if draw(st.integers(0, 9)) == 0:
        item["extra"] = 1
    if draw(st.integers(0, 9)) == 0:
        item = dict(reversed(item.items()))
    return item


content_lists = st.one_of(st.lists(logprob_items(), max_size=4), json_values)


@st.composite
def model_request_shaped(draw: st.DrawFn) -> dict[str, Any]:
    """Dicts with the keys the codec looks at, holding both well-formed and arbitrary values."""

    def maybe(strategy: st.SearchStrategy[Any]) -> dict[str, Any]:
        return draw(st.fixed_dictionaries({}, optional={"x": strategy}))

    choice: dict[str, Any] = {}
    for key, strategy in (("prompt_token_ids", id_lists), ("token_ids", id_lists)):
        if "x" in (found := maybe(strategy)):
            choice[key] = found["x"]
    logprobs: dict[str, Any] = {}
    for key, strategy in (
        ("content", content_lists),
        ("tokens", st.lists(st.text(max_size=3), max_size=4) | json_values),
        ("token_logprobs", float_lists),
        ("text_offset", id_lists),
    ):
        if "x" in (found := maybe(strategy)):
            logprobs[key] = found["x"]
    if logprobs or draw(st.booleans()):
        choice["logprobs"] = logprobs if draw(st.integers(0, 5)) else draw(json_values)
    response: dict[str, Any] = draw(json_objects)
    if "x" in (found := maybe(id_lists)):
        response["prompt_token_ids"] = found["x"]
    response["choices"] = draw(st.lists(st.just(choice) | json_values, min_size=0, max_size=2))
    request: dict[str, Any] = {"model": "m"}
    if "x" in (found := maybe(st.lists(json_values, max_size=4) | json_values)):
        request["messages"] = found["x"]
    if "x" in (found := maybe(id_lists)):
        request["prompt"] = found["x"]
    data: dict[str, Any] = draw(json_objects)
    data["request"] = request if draw(st.integers(0, 5)) else draw(json_values)
    data["response"] = response if draw(st.integers(0, 5)) else draw(json_values)
    return copy.deepcopy(data)  # no shared sub-objects from `st.just`


# Perturbations of realistic calls: each takes a call and a hypothesis draw and changes the call.
Perturbation = Callable[[dict[str, Any], st.DrawFn], None]


def _content(data: dict[str, Any]) -> list[Any]:
    return data["response"]["choices"][0]["logprobs"]["content"]


def _entry(data: dict[str, Any], draw: st.DrawFn) -> dict[str, Any]:
    content = _content(data)
    return content[draw(st.integers(0, len(content) - 1))]


def _set_entry(key: str, value: Any) -> Perturbation:
    return lambda data, draw: _entry(data, draw).__setitem__(key, value)


def _set_top(key: str, value: Any) -> Perturbation:
    return lambda data, draw: _entry(data, draw)["top_logprobs"][0].__setitem__(key, value)


def _set_id(key: str, value: Any) -> Perturbation:
    def perturb(data: dict[str, Any], draw: st.DrawFn) -> None:
        response = data["response"]
        ids = response[key] if key == "prompt_token_ids" else response["choices"][0][key]
        ids[draw(st.integers(0, len(ids) - 1))] = value

    return perturb


def to_completions(data: dict[str, Any], *, null_first: bool = False, request_prompt: bool = False) -> None:
    """Reshape a chat call into what a completions endpoint returns for the same tokens."""
    response = data["response"]
    choice = response["choices"][0]
    choice["prompt_token_ids"] = response.pop("prompt_token_ids")
    content = choice["logprobs"]["content"]
    choice["logprobs"] = {
        "text_offset": [3 * i for i in range(len(content))],
        "token_logprobs": [entry["logprob"] for entry in content],
        "tokens": [entry["token"] for entry in content],
        "top_logprobs": [{t["token"]: t["logprob"] for t in entry["top_logprobs"]} for entry in content],
    }
    if null_first:
        choice["logprobs"]["token_logprobs"][0] = None
    if request_prompt:
        data["request"]["prompt"] = list(choice["prompt_token_ids"])


def _diverge(data: dict[str, Any], draw: st.DrawFn) -> None:
    ids = data["response"]["prompt_token_ids"]
    cut = draw(st.integers(0, len(ids)))
    ids[cut:] = draw(st.lists(st.integers(0, 1000), max_size=20))


def to_error(data: dict[str, Any]) -> None:
    """What the gateway records for a call the model server refused."""
    data["response"] = {"error": {"message": "upstream overloaded", "code": 503}}
    data["http_status"] = 503
    data["status"] = "error"


PERTURBATIONS: list[Perturbation] = [
    _set_entry("extra", 1),
    _set_entry("logprob", None),
    _set_entry("logprob", -1),
    _set_entry("logprob", math.nan),
    _set_entry("logprob", -math.inf),
    _set_entry("logprob", -0.0),
    _set_entry("bytes", None),
    _set_entry("bytes", [300]),
    _set_entry("bytes", [True]),
    _set_entry("bytes", [0, 255]),
    _set_entry("token", 5),
    _set_entry("token", "\ud800"),
    _set_entry("top_logprobs", None),
    _set_top("bytes", [1]),
    _set_top("logprob", 2),
    lambda data, draw: _entry(data, draw)["top_logprobs"][0].pop("bytes"),
    lambda data, draw: _content(data).append("not an entry"),
    _set_id("prompt_token_ids", 1.0),
    _set_id("prompt_token_ids", True),
    _set_id("prompt_token_ids", 2**40),
    _set_id("prompt_token_ids", -(2**63)),
    _set_id("token_ids", 2**70),
    _set_id("token_ids", False),
    _set_id("token_ids", 2**31),
    lambda data, draw: data["response"].pop("prompt_token_ids"),
    lambda data, draw: data["response"].__setitem__("prompt_token_ids", []),
    lambda data, draw: data["response"]["choices"][0].pop("token_ids"),
    lambda data, draw: data["response"].__setitem__("choices", []),
    lambda data, draw: data["response"].__setitem__("choices", "x"),
    lambda data, draw: data["response"]["choices"].append(copy.deepcopy(data["response"]["choices"][0])),
    lambda data, draw: data.__setitem__("response", None),
    lambda data, draw: data.__setitem__(
        "response", [{"prompt_token_ids": [1, 2]}, {"choices": [{"token_ids": [3]}]}]
    ),
    lambda data, draw: data.pop("request"),
    lambda data, draw: data["request"].__setitem__("messages", "x"),
    lambda data, draw: data["request"]["messages"].append("a string message"),
    lambda data, draw: data["request"]["messages"].append({"role": "user", "content": math.nan}),
    lambda data, draw: data["request"]["messages"].pop(0),
    lambda data, draw: data["request"]["messages"].__setitem__(0, {"content": "x", "role": "system"}),
    lambda data, draw: data.__setitem__("response", dict(reversed(data["response"].items()))),
    lambda data, draw: data.__setitem__("server", "not an object"),
    lambda data, draw: data.__setitem__("routed_experts", [[1, 2], [3, 4]]),
    lambda data, draw: to_completions(
        data, null_first=draw(st.booleans()), request_prompt=draw(st.booleans())
    ),
    _diverge,
    lambda data, draw: to_error(data),
]


@st.composite
def perturbed_rollouts(draw: st.DrawFn) -> list[dict[str, Any]]:
    calls = growing_prefix_rollout(draw(st.integers(1, 4)), seed=draw(st.integers(0, 3)), **SMALL)
    calls = [copy.deepcopy(call) for call in calls]  # no messages shared between calls
    for _ in range(draw(st.integers(0, 4))):
        target = calls[draw(st.integers(0, len(calls) - 1))]
        # An earlier perturbation may have removed what this one changes.
        with contextlib.suppress(KeyError, IndexError, TypeError, AttributeError):
            draw(st.sampled_from(PERTURBATIONS))(target, draw)
    return calls


# -- plain JSON -------------------------------------------------------------------------------------


@settings(derandomize=True, max_examples=100, deadline=None)
@given(json_objects)
def test_plain_events_round_trip_exactly(data: dict[str, Any]) -> None:
    assert_same(decode_json(encode_json(data)), data)


def test_plain_events_are_json_text_even_when_orjson_cannot_write_them() -> None:
    data = {"big": 2**80, "nan": math.nan, "inf": -math.inf, "zero": -0.0, "s": "\ud800é"}
    blob = encode_json(data)
    assert blob.startswith(b" ")  # the stdlib's output, marked for the stdlib's reader
    assert_same(json.loads(blob), data)
    assert_same(decode_json(blob), data)
    assert encode_json({"a": [1, 2.5, None]}) == b'{"a":[1,2.5,null]}'  # orjson's, untouched


def test_deep_nesting_round_trips() -> None:
    for depth in (250, 300, 600):
        nested: Any = "leaf"
        for _ in range(depth):
            nested = [nested, {"k": 1}]
        data = {"deep": nested, "response": {"prompt_token_ids": [1, 2, 3], "x": nested}}
        assert_same(decode_json(encode_json(data)), data)
        assert_same(decode_model_request(encode_model_request(data, None)[0], None)[0], data)


def test_decode_json_rejects_what_encode_json_never_wrote() -> None:
    with pytest.raises(CodecError):
        decode_json(b"{not json")
    with pytest.raises(CodecError):
        decode_json(b"[1, 2]")


# -- model_request: exactness -----------------------------------------------------------------------


@settings(derandomize=True, max_examples=60, deadline=None)
@given(json_objects)
def test_any_dict_round_trips_as_a_model_request(data: dict[str, Any]) -> None:
    round_trip_chain([data])
    prev = encode_model_request(growing_prefix_rollout(1, **SMALL)[0], None)[1]
    blob, _ = encode_model_request(data, prev)
    assert_same(decode_model_request(blob, prev)[0], data)


@settings(derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(model_request_shaped(), min_size=1, max_size=2))
def test_model_request_shaped_dicts_round_trip(calls: list[dict[str, Any]]) -> None:
    round_trip_chain(calls)


@settings(derandomize=True, max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(perturbed_rollouts())
def test_perturbed_vllm_rollouts_round_trip(calls: list[dict[str, Any]]) -> None:
    round_trip_chain(calls)


def test_bools_and_floats_in_id_lists_stay_what_they_were() -> None:
    data = {"response": {"prompt_token_ids": [1, True, 3], "choices": [{"token_ids": [1.0, 2]}]}}
    decoded = decode_model_request(encode_model_request(data, None)[0], None)[0]
    assert_same(decoded, data)
    assert decoded["response"]["prompt_token_ids"][1] is True


def test_ids_beyond_int32_come_back_as_int64_arrays() -> None:
    data = {"response": {"prompt_token_ids": [1, 2**40], "choices": [{"token_ids": [-(2**63), 5]}]}}
    triplet, ctx = decode_model_request_triplet(encode_model_request(data, None)[0], None)
    assert triplet["prompt_token_ids"].dtype == np.int64
    assert triplet["response_token_ids"].tolist() == [-(2**63), 5]
    assert ctx.prompt is not None and ctx.prompt.dtype == np.int64


def test_completions_calls_round_trip_and_reuse_the_prompt() -> None:
    calls = [copy.deepcopy(call) for call in growing_prefix_rollout(3, **SMALL)]
    for call in calls:
        to_completions(call, request_prompt=True)
    blobs = round_trip_chain(calls)
    triplet = decode_model_request_triplet(blobs[0], None)[0]
    assert triplet["prompt_token_ids"].tolist() == calls[0]["response"]["choices"][0]["prompt_token_ids"]
    # The request's token-id prompt equals the response's: stored once. Its 40 ids would take 160
    # bytes again; what the request's reference costs is its key in the (compressed) request JSON.
    without = copy.deepcopy(calls[0])
    del without["request"]["prompt"]
    assert len(blobs[0]) - len(encode_model_request(without, None)[0]) < 40


# -- model_request: chains ---------------------------------------------------------------------------


def test_a_growing_prefix_rollout_is_stored_within_twice_its_distinct_content() -> None:
    calls = growing_prefix_rollout(50)
    blobs = round_trip_chain(calls)
    total = sum(len(blob) for blob in blobs)
    assert total < 2 * distinct_content_bytes(calls)
    # Linear, not quadratic: a late call costs what an early one does.
    assert max(len(b) for b in blobs[5:]) < 1.3 * min(len(b) for b in blobs[5:])


def test_what_a_chain_shares_is_compared_exactly() -> None:
    """The encoder finds a prompt or history that extends the previous call's by comparing JSON text
    and caches token encodings: values that look or compare like the previous ones stay what they were."""
    calls = [copy.deepcopy(call) for call in growing_prefix_rollout(5, **SMALL)]
    # A NaN in a message the previous call had with null: orjson writes both as null.
    calls[0]["request"]["messages"][0]["name"] = None
    calls[1]["request"]["messages"][0]["name"] = math.nan
    # A bool where the previous prompt had 1; after the prefix, ids that need int64, a bool, and an
    # id beyond int64 (each prompt still extends the previous prompt + response).
    prompts = [call["response"]["prompt_token_ids"] for call in calls]
    for prompt in prompts:
        prompt[3] = 1
    prompts[1][3] = True
    for k, value in ((2, 2**40), (3, False), (4, 2**64 - 1)):
        at = len(prompts[k])
        for prompt in prompts[k:]:
            prompt.insert(at, value)
    # Token bytes equal to the UTF-8 as ints but not ints, and odd bytes among the usual ones.
    content = calls[2]["response"]["choices"][0]["logprobs"]["content"]
    content[0]["bytes"] = [float(b) for b in content[0]["token"].encode()]
    content[1]["top_logprobs"][0].update(token="\x01", bytes=[True])
    content = calls[3]["response"]["choices"][0]["logprobs"]["content"]
    content[0]["bytes"], content[2]["bytes"] = None, [0xE6]
    for _ in range(2):  # the second time from the token cache
        blobs = round_trip_chain(calls)
    decoded = decode_model_request(blobs[0], None)
    decoded = decode_model_request(blobs[1], decoded[1])[0]
    assert math.isnan(decoded["request"]["messages"][0]["name"])
    assert decoded["response"]["prompt_token_ids"][3] is True


def test_a_chain_decoded_against_the_wrong_previous_call_raises() -> None:
    calls = growing_prefix_rollout(3, **SMALL)
    other = growing_prefix_rollout(3, seed=1, **SMALL)  # same shapes, other ids and messages
    blobs, contexts = [], []
    ctx: CallContext | None = None
    for call in calls:
        blob, ctx = encode_model_request(call, ctx)
        blobs.append(blob)
        contexts.append(ctx)
    other_ctx = encode_model_request(other[1], encode_model_request(other[0], None)[1])[1]
    for wrong in (None, contexts[0], other_ctx):
        for decode in (decode_model_request, decode_model_request_triplet):
            with pytest.raises(CodecError):
                decode(blobs[2], wrong)
    assert_same(decode_model_request(blobs[2], contexts[1])[0], calls[2])


def test_a_writer_without_context_stores_the_call_in_full() -> None:
    calls = growing_prefix_rollout(3, **SMALL)
    first, ctx = encode_model_request(calls[0], None)
    chained, _ = encode_model_request(calls[1], ctx)
    alone, _ = encode_model_request(calls[1], None)  # e.g. after a restart
    assert len(chained) < len(alone)
    # Readers always thread their context; a self-contained blob ignores it.
    reader_ctx = decode_model_request(first, None)[1]
    assert_same(decode_model_request(alone, reader_ctx)[0], calls[1])
    assert_same(decode_model_request(alone, None)[0], calls[1])


def test_a_failed_call_does_not_break_the_chain() -> None:
    calls = [copy.deepcopy(call) for call in growing_prefix_rollout(4, **SMALL)]
    to_error(calls[1])
    del calls[1]["request"]
    blobs = round_trip_chain(calls)
    # The call after the failure still extends the last call that had ids and messages.
    assert len(blobs[2]) < len(encode_model_request(calls[2], None)[0])


def test_a_retried_call_round_trips_and_the_next_call_extends_it() -> None:
    calls = [copy.deepcopy(call) for call in growing_prefix_rollout(3, **SMALL)]
    retry = copy.deepcopy(calls[1])
    retry["response"]["choices"][0]["token_ids"] = [7, 8, 9]
    retry["retry_count"] = 1
    round_trip_chain([calls[0], calls[1], retry, calls[2]])


def test_rereading_with_old_contexts_leaves_earlier_results_intact() -> None:
    """Decoded prompts share one buffer; decoding again from an old context must not overwrite it."""
    calls = growing_prefix_rollout(6, **SMALL)
    blobs = round_trip_chain(calls)
    first_pass, contexts = [], []
    ctx: CallContext | None = None
    for blob in blobs:
        triplet, ctx = decode_model_request_triplet(blob, ctx)
        first_pass.append(triplet)
        contexts.append(ctx)
    for k in (3, 1, 4, 1):  # branch off old contexts, twice from the same one
        again, _ = decode_model_request_triplet(blobs[k + 1], contexts[k])
        assert_same_triplet(again, trim_model_request(calls[k + 1]))
    for triplet, call in zip(first_pass, calls, strict=True):
        assert_same_triplet(triplet, trim_model_request(call))
        assert not triplet["prompt_token_ids"].flags.writeable


def test_decoded_messages_lists_are_not_shared_between_calls() -> None:
    calls = growing_prefix_rollout(2, **SMALL)
    blobs = round_trip_chain(calls)
    first, ctx = decode_model_request(blobs[0], None)
    first["request"]["messages"].append({"role": "user", "content": "appended by a reader"})
    assert_same(decode_model_request(blobs[1], ctx)[0], calls[1])


def test_a_token_id_request_prompt_that_differs_from_the_response_is_a_delta_too() -> None:
    calls = [copy.deepcopy(call) for call in growing_prefix_rollout(2, initial_prompt=500, **_NO_PROMPT)]
    for call in calls:
        to_completions(call)
        call["request"]["prompt"] = [*call["response"]["choices"][0]["prompt_token_ids"], 424242]
    blobs = round_trip_chain(calls)
    assert len(blobs[1]) < len(blobs[0]) - 2 * 4 * 500  # neither prompt stored in full


def test_messages_alone_extend_the_previous_call() -> None:
    history = [{"role": "user", "content": "x" * 1000}]
    calls = [{"request": {"messages": history[:]}}, {"request": {"messages": [*history, {"role": "tool"}]}}]
    blobs = round_trip_chain(calls)
    assert len(blobs[1]) < 200
    with pytest.raises(CodecError):
        decode_model_request(blobs[1], None)
    other = encode_model_request({"request": {"messages": [{"role": "user", "content": "y" * 1000}]}}, None)[
        1
    ]
    with pytest.raises(CodecError):
        decode_model_request_triplet(blobs[1], other)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(st.data())
def test_corrupted_blobs_raise_codec_error_or_decode(data: st.DataObject) -> None:
    """A damaged blob is a `CodecError` (or, damaged inside a value, decodes to other values),
    never an IndexError, KeyError or the like that a caller would not expect."""
    calls = growing_prefix_rollout(2, **SMALL)
    ctx = encode_model_request(calls[0], None)[1]
    blob = bytearray(encode_model_request(calls[1], ctx)[0])
    header = 7 + 9 * blob[3]
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, header + 40) | st.integers(0, len(blob) - 1))
        blob[min(position, len(blob) - 1)] = data.draw(st.integers(0, 255))
    for decode in (decode_model_request, decode_model_request_triplet):
        with contextlib.suppress(CodecError):
            decode(bytes(blob), ctx)


@pytest.mark.parametrize("cut", [0, 1, 6, 7, 20, -200, -1])
def test_truncated_or_foreign_blobs_raise_codec_error(cut: int) -> None:
    blob = encode_model_request(growing_prefix_rollout(1, **SMALL)[0], None)[0]
    for decode in (decode_model_request, decode_model_request_triplet):
        with pytest.raises(CodecError):
            decode(blob[:cut], None)
        with pytest.raises(CodecError):
            decode(b'{"response": {}}', None)

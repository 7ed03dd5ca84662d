"""The exact-token option (`--exact-tokens`): which earlier call a chat call continues, and the prompt
ids that continue it exactly (`keraunos.gateway.proxy.exact`), then the option in a real gateway.

The pure tests render prompts with a small ChatML-like template over character ids, so that a
"sampled" reply can be given ids its text would never tokenise to, as a model at temperature 1.0
does; the exact prompt must carry those ids, not the re-tokenised text. The gateway tests run a real
gateway against the engine stand-in, which has no `/tokenize` (like `keraunos serve`): the option
must then send every call unchanged, and count why; and against a stand-in with vLLM's `/tokenize`
and `kv_transfer_params.prompt_token_ids` (`TokenizingEngine`), where each call must go with the
previous call's ids, and an engine that refuses or ignores them must still answer every call.
tests/vllm/test_vllm_exact_tokens.py does the same against real vLLM.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from keraunos import prefix
from keraunos.gateway.proxy import exact
from keraunos.testing.processes import SERVED_MODEL, Engine, Gateway

IM_START, IM_END = 1, 2


def tok(text: str) -> list[int]:
    """The template's tokeniser: one id per character."""
    return [1000 + ord(char) for char in text]


def render(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """ChatML over character ids, as vLLM's /tokenize would give it."""
    ids: list[int] = []
    for message in messages:
        ids += [
            IM_START,
            *tok(f"{message['role']}\n"),
            *tok(message.get("content") or ""),
            IM_END,
            *tok("\n"),
        ]
    if add_generation_prompt:
        ids += [IM_START, *tok("assistant\n")]
    return ids


def sampled(text: str, *, stopped: bool) -> list[int]:
    """Ids a model might sample for `text`: two characters an id, never what `tok` gives."""
    ids = [5000 + i for i in range(0, len(text), 2)]
    return [*ids, IM_END] if stopped else ids


def response(prompt: list[int], *replies: tuple[str, list[int], str]) -> dict[str, Any]:
    """A vLLM chat answer with `return_token_ids`: (content, token_ids, finish_reason) per choice."""
    return {
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "token_ids": ids,
                "finish_reason": why,
            }
            for i, (text, ids, why) in enumerate(replies)
        ],
    }


def keep(memory: exact.Memory, request: dict[str, Any], answer: dict[str, Any]) -> None:
    """Remember a recorded call of attempt (r, 0)."""
    turn = exact.turn_of(request, answer)
    assert turn is not None
    memory.remember("r", "0", turn)


def exact_prompt(memory: exact.Memory, request: dict[str, Any]) -> np.ndarray | exact.Miss:
    """What the shell does, with `render` in place of the engine's /tokenize."""
    if (reason := exact.unsupported(request)) is not None:
        return exact.Miss(reason)
    match = exact.find(memory.turns("r", "0"), request)
    if isinstance(match, exact.Miss):
        return match
    y_body, x_body = exact.render_bodies(match, request, "m")
    return exact.splice(
        match, render(y_body["messages"]), render(x_body["messages"], x_body["add_generation_prompt"])
    )


SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Tell me about bees."}


def first_call(memory: exact.Memory, reply: str, *, stopped: bool) -> tuple[list[int], list[int]]:
    """Record a first call (rendered as usual) and return its prompt and sampled ids."""
    prompt = render([SYSTEM, USER])
    ids = sampled(reply, stopped=stopped)
    request = {"messages": [SYSTEM, USER]}
    turn = exact.turn_of(request, response(prompt, (reply, ids, "stop" if stopped else "length")))
    assert turn is not None
    memory.remember("r", "0", turn)
    return prompt, ids


def test_the_next_prompt_carries_the_sampled_ids_then_the_templates_glue_after_a_reply_cut_at_max_tokens() -> (
    None
):
    memory = exact.Memory(10_000)
    prompt, ids = first_call(memory, "Bees make honey", stopped=False)
    follow_up = {"role": "user", "content": "Why?"}
    request = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "Bees make honey"}, follow_up]}

    ids_sent = exact_prompt(memory, request)

    glue = [IM_END, *tok("\n"), *render([follow_up])]
    assert isinstance(ids_sent, np.ndarray)
    assert ids_sent.tolist() == [*prompt, *ids, *glue]
    assert prefix.extends(np.asarray(prompt), np.asarray(ids), ids_sent) == len(prompt) + len(ids)


def test_an_end_of_turn_token_the_model_sampled_is_not_repeated_by_the_templates_copy() -> None:
    memory = exact.Memory(10_000)
    prompt, ids = first_call(memory, "Bees make honey.", stopped=True)
    follow_up = {"role": "user", "content": "Why?"}
    request = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "Bees make honey."}, follow_up]}

    ids_sent = exact_prompt(memory, request)

    assert isinstance(ids_sent, np.ndarray)
    assert ids_sent.tolist() == [
        *prompt,
        *ids,
        *tok("\n"),
        *render([follow_up]),
    ]  # one IM_END: the sampled one


def test_over_many_turns_every_prompt_extends_the_previous_prompt_and_sampled_reply() -> None:
    memory = exact.Memory(100_000)
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    previous: tuple[np.ndarray, np.ndarray] | None = None
    for turn in range(6):
        request = {"messages": list(messages)}
        ids_sent = exact_prompt(memory, request) if previous else np.asarray(render(messages))
        assert isinstance(ids_sent, np.ndarray), ids_sent
        if previous is not None:
            assert prefix.extends(previous[0], previous[1], ids_sent) is not None
        reply = f"Reply number {turn}, sampled in pieces."
        ids = np.asarray(sampled(reply, stopped=turn % 2 == 0))
        answer = response(ids_sent.tolist(), (reply, ids.tolist(), "stop" if turn % 2 == 0 else "length"))
        recorded = exact.turn_of(request, answer)
        assert recorded is not None
        memory.remember("r", "0", recorded)
        previous = (ids_sent, ids)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And {turn}?"}]


def test_the_choice_the_agent_went_on_with_is_spliced_and_two_equal_replies_with_other_ids_are_ambiguous() -> (
    None
):
    memory = exact.Memory(10_000)
    prompt = render([SYSTEM, USER])
    two = response(prompt, ("Honey.", [7001, 7002], "length"), ("Wax.", [7003], "length"))
    keep(memory, {"messages": [SYSTEM, USER]}, two)
    request = {
        "messages": [SYSTEM, USER, {"role": "assistant", "content": "Wax."}, {"role": "user", "content": "?"}]
    }

    ids_sent = exact_prompt(memory, request)
    assert isinstance(ids_sent, np.ndarray)
    assert ids_sent[len(prompt) : len(prompt) + 2].tolist() == [7003, IM_END]

    same = response(prompt, ("Wax.", [7003], "length"), ("Wax.", [7004, 7005], "length"))
    keep(memory, {"messages": [SYSTEM, USER]}, same)
    assert exact_prompt(memory, request) == exact.Miss(exact.AMBIGUOUS_CHOICE)


def test_a_request_continues_the_latest_remembered_call_whose_messages_and_reply_it_repeats() -> None:
    memory = exact.Memory(10_000)
    prompt = render([SYSTEM, USER])
    for reply, ids in (("First try.", [7001]), ("Second try.", [7002])):  # the agent retried its call
        keep(memory, {"messages": [SYSTEM, USER]}, response(prompt, (reply, ids, "length")))
    going_on = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "First try."}]}

    ids_sent = exact_prompt(memory, going_on)

    assert isinstance(ids_sent, np.ndarray)
    assert ids_sent[len(prompt)] == 7001


def test_a_history_the_agent_edited_or_a_changed_tool_list_falls_back_with_its_reason() -> None:
    memory = exact.Memory(10_000)
    first_call(memory, "Bees make honey", stopped=False)
    edited = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "Bees make wax"}]}
    summarised = {
        "messages": [{"role": "system", "content": "Summary."}, {"role": "user", "content": "Go on."}]
    }
    with_tools = {
        "messages": [SYSTEM, USER, {"role": "assistant", "content": "Bees make honey"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }

    assert exact_prompt(memory, edited) == exact.Miss(exact.MESSAGES_DIFFER)
    assert exact_prompt(memory, summarised) == exact.Miss(exact.MESSAGES_DIFFER)
    assert exact_prompt(memory, with_tools) == exact.Miss(exact.RENDER_CHANGED)
    assert exact.find(exact.Memory(1).turns("r", "0"), edited) == exact.Miss(exact.MESSAGES_DIFFER)


def test_a_tool_call_reply_matches_when_the_agent_sends_it_back_without_its_id_and_not_with_other_arguments() -> (
    None
):
    memory = exact.Memory(10_000)
    call = {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    answer = response(render([SYSTEM, USER]), ("", [7001, 7002], "tool_calls"))
    answer["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    keep(memory, {"messages": [SYSTEM, USER]}, answer)
    tool = {"role": "tool", "tool_call_id": "call-1", "content": "2"}
    without_id = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    other = {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}

    sent_back = {
        "messages": [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [without_id]}, tool]
    }
    assert isinstance(exact_prompt(memory, sent_back), np.ndarray)
    match = exact.find(memory.turns("r", "0"), sent_back)
    assert isinstance(match, exact.Match)
    y_body, x_body = exact.render_bodies(match, sent_back, "m")
    assert x_body["messages"][2] == {"role": "assistant", "content": ""}  # no tool calls rendered twice
    assert y_body["messages"] == [SYSTEM, USER] and y_body["add_generation_prompt"] is True
    changed = {
        "messages": [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [other]}, tool]
    }
    assert exact_prompt(memory, changed) == exact.Miss(exact.MESSAGES_DIFFER)


def test_a_whitespace_only_reply_text_the_agent_dropped_when_sending_the_turn_back_still_matches() -> None:
    # Claude Code drops a whitespace-only text block sampled before a tool call (through the
    # Messages conversion the turn comes back with no text): the sampled ids still continue.
    memory = exact.Memory(10_000)
    call = {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    answer = response(render([SYSTEM, USER]), ("", [7000, 7001, 7002], "tool_calls"))
    answer["choices"][0]["message"] = {"role": "assistant", "content": "\n\n", "tool_calls": [call]}
    keep(memory, {"messages": [SYSTEM, USER]}, answer)
    tool = {"role": "tool", "tool_call_id": "call-1", "content": "2"}
    for sent in (None, "", "\n"):
        back = {
            "messages": [SYSTEM, USER, {"role": "assistant", "content": sent, "tool_calls": [call]}, tool]
        }
        spliced = exact_prompt(memory, back)
        assert isinstance(spliced, np.ndarray), sent
        assert spliced[: len(render([SYSTEM, USER])) + 3].tolist() == [
            *render([SYSTEM, USER]),
            7000,
            7001,
            7002,
        ]
    text = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "ok", "tool_calls": [call]}, tool]}
    assert exact_prompt(memory, text) == exact.Miss(exact.MESSAGES_DIFFER)  # real text must still match


def test_a_template_that_does_not_render_the_reply_after_its_generation_prompt_falls_back() -> None:
    memory = exact.Memory(10_000)
    first_call(memory, "Bees make honey", stopped=False)
    request = {"messages": [SYSTEM, USER, {"role": "assistant", "content": "Bees make honey"}]}
    match = exact.find(memory.turns("r", "0"), request)
    assert isinstance(match, exact.Match)
    y = render([SYSTEM, USER])
    # e.g. a template that renders a generation prompt with a marker its assistant turns lack
    assert exact.splice(match, [*y, 9], [*y, 8, IM_END]) == exact.Miss(exact.TEMPLATE_MISMATCH)


def test_requests_the_engine_must_render_itself_are_unsupported() -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    text_parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert exact.unsupported({"messages": [image]}) == exact.UNSUPPORTED_REQUEST
    assert exact.unsupported({"messages": [USER], "echo": True}) == exact.UNSUPPORTED_REQUEST
    assert (
        exact.unsupported({"messages": [USER], "kv_transfer_params": {"prompt_token_ids": [1]}}) is not None
    )
    assert exact.unsupported({"messages": "hi"}) == exact.UNSUPPORTED_REQUEST
    assert exact.unsupported({"messages": [text_parts], "kv_transfer_params": {"other": 1}}) is None


def test_calls_without_ids_or_without_a_generation_prompt_are_not_remembered() -> None:
    prompt = render([SYSTEM, USER])
    assert exact.turn_of({"messages": [USER]}, {"choices": []}) is None
    assert exact.turn_of({"messages": [USER]}, response(prompt, ("x", [], "stop"))) is None
    assert (
        exact.turn_of(
            {"messages": [USER], "continue_final_message": True}, response(prompt, ("x", [1], "stop"))
        )
        is None
    )
    assert exact.turn_of({"messages": [USER]}, response([*prompt, -1], ("x", [1], "stop"))) is None
    assert exact.turn_of({"messages": [USER]}, response(prompt, ("x", [1], "stop"))) is not None


def test_the_ids_go_in_kv_transfer_params_beside_the_agents_own_keys_and_the_request_is_not_changed() -> None:
    request = {"messages": [USER], "kv_transfer_params": {"do_remote_decode": False}}
    sent = exact.with_prompt_ids(request, np.asarray([3, 4]))
    assert sent["kv_transfer_params"]["do_remote_decode"] is False
    assert sent["kv_transfer_params"]["prompt_token_ids"].tolist() == [3, 4]
    assert request == {"messages": [USER], "kv_transfer_params": {"do_remote_decode": False}}


def test_the_memory_keeps_four_calls_an_attempt_and_forgets_the_least_recently_active_attempt_over_budget() -> (
    None
):
    memory = exact.Memory(max_ids=30)
    turn = exact.turn_of({"messages": [USER]}, response(list(range(8)), ("x", [9, 10], "stop")))
    assert turn is not None and turn.size == 10
    for _ in range(6):
        memory.remember("r", "a", turn)
    assert len(memory.turns("r", "a")) == exact.CALLS_PER_ATTEMPT and memory.ids == 40  # alone: kept
    memory.remember("r", "b", turn)
    assert memory.turns("r", "a") == [] and memory.ids == 10
    memory.remember("r", "c", turn)
    memory.turns("r", "b")  # b is now the most recently active
    memory.remember("r", "d", turn)
    memory.remember("r", "d", turn)
    assert memory.turns("r", "c") == [] and len(memory.turns("r", "b")) == 1 and memory.ids == 30


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "tool_calls",
                    "function",
                    "id",
                    "type",
                    "messages",
                    "choices",
                    "token_ids",
                    "prompt_token_ids",
                    "message",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(request=_JSON, answer=_JSON)
def test_records_and_requests_of_any_shape_give_a_turn_a_match_or_a_reason_never_an_exception(
    request: Any, answer: Any
) -> None:
    memory = exact.Memory(1000)
    turn = exact.turn_of(request, answer)
    if turn is not None:
        memory.remember("r", "0", turn)
    if isinstance(request, dict) and exact.unsupported(request) is None:
        assert isinstance(exact.find(memory.turns("r", "0"), request), exact.Match | exact.Miss)


# -- in a gateway --------------------------------------------------------------------------------


def fallbacks(gateway: Gateway) -> dict[str, float]:
    with gateway.client() as api:
        text = api.get("/metrics").text
    counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keraunos_proxy_exact_fallbacks_total":
                counts[sample.labels["reason"]] = sample.value
            elif sample.name == "keraunos_proxy_exact_spliced_total":
                counts["spliced"] = sample.value
    return counts


@pytest.fixture(scope="module")
def exact_gateway(session_gateway_factory: Any, engine: Engine) -> Gateway:
    """A gateway with --exact-tokens in front of the engine stand-in (which has no /tokenize)."""
    gateway = session_gateway_factory(args=("--served-model", SERVED_MODEL, "--exact-tokens", "true"))
    gateway.register([engine])
    return gateway


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [False, True])
def test_with_an_engine_without_tokenize_every_call_goes_as_rendered_and_is_counted(
    exact_gateway: Gateway, new_id: Any, stream: bool
) -> None:
    before = fallbacks(exact_gateway)
    rollout_id = new_id("exact")
    with exact_gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    url = f"{exact_gateway.proxy_base(rollout_id)}/chat/completions"
    messages: list[dict[str, Any]] = [USER]
    with httpx.Client(headers=exact_gateway.headers, timeout=30) as client:
        for _ in range(3):
            body = {"messages": messages, "max_tokens": 4, "stream": stream}
            answer = client.post(url, json=body)
            assert answer.status_code == 200, answer.text
            if stream:
                reply = "".join(
                    chunk["choices"][0]["delta"].get("content") or ""
                    for line in answer.text.splitlines()
                    if line.startswith("data: {")
                    and (chunk := httpx.Response(200, content=line[6:]).json())["choices"]
                )
            else:
                reply = answer.json()["choices"][0]["message"]["content"]
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "more"},
            ]
    after = fallbacks(exact_gateway)
    assert after["no_earlier_call"] - before["no_earlier_call"] == 1
    assert after["tokenize_failed"] - before["tokenize_failed"] == 2
    assert after["spliced"] == before["spliced"]
    with exact_gateway.client() as api:
        events = api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"}).json()
    assert [event["data"]["status"] for event in events] == ["ok"] * 3
    assert all("exact_tokens" not in event["data"]["server"] for event in events)
    assert all("kv_transfer_params" not in event["data"]["request"] for event in events)


# -- in a gateway, against a stand-in engine with /tokenize ----------------------------------------


class TokenizingEngine(ThreadingHTTPServer):
    """A model-server stand-in as big as the option needs: vLLM's `/tokenize` with `render`, and
    chat calls served on `kv_transfer_params.prompt_token_ids` when given (as vLLM does), each
    reply sampled in pieces its text never tokenises to. `mode` "refuse" answers 400 to prompt
    ids, "ignore" renders the messages whatever it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EngineHandler)
        self.mode = "serve"
        self.calls = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _EngineHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        engine = self.server
        assert isinstance(engine, TokenizingEngine)
        if self.path == "/tokenize":
            tokens = render(body["messages"], body.get("add_generation_prompt", True))
            return self._answer(200, {"count": len(tokens), "max_model_len": 100_000, "tokens": tokens})
        ids = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
        if ids is not None and engine.mode == "refuse":
            return self._answer(400, {"error": {"message": "prompt_token_ids refused"}})
        prompt = ids if ids is not None and engine.mode == "serve" else render(body["messages"])
        engine.calls += 1
        text = f"Reply {engine.calls} in pieces"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        self._answer(
            200,
            {"prompt_token_ids": prompt, "choices": [{**choice, "token_ids": sampled(text, stopped=False)}]},
        )

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the gateway's record, not this server's log."""


@pytest.fixture(scope="module")
def tokenizing() -> Iterator[TokenizingEngine]:
    engine = TokenizingEngine()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def splicing_gateway(session_gateway_factory: Any, tokenizing: TokenizingEngine) -> Gateway:
    """A gateway with --exact-tokens whose served model is served by `tokenizing`."""
    gateway = session_gateway_factory(args=("--served-model", "standin", "--exact-tokens", "true"))
    with gateway.client() as api:
        models = [{"model": "standin", "endpoint": tokenizing.endpoint, "version": 0}]
        assert api.post("/api/models", json=models).status_code == 201
    return gateway


def chat_three_turns(gateway: Gateway, rollout_id: str) -> list[dict[str, Any]]:
    """Three chat turns of an agent that sends each reply back; the recorded calls."""
    with gateway.client() as api:
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    with httpx.Client(headers=gateway.headers, timeout=30) as client:
        for turn in range(3):
            answer = client.post(
                f"{gateway.proxy_base(rollout_id)}/chat/completions", json={"messages": messages}
            )
            assert answer.status_code == 200, answer.text
            reply = answer.json()["choices"][0]["message"]["content"]
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"{turn}?"},
            ]
    with gateway.client() as api:
        return api.get(f"/api/rollouts/{rollout_id}/events", params={"event_type": "model_request"}).json()


@pytest.mark.timeout(60)
def test_through_a_gateway_each_call_goes_with_the_previous_calls_ids_and_is_recorded_as_exact(
    splicing_gateway: Gateway, tokenizing: TokenizingEngine, new_id: Any
) -> None:
    tokenizing.mode = "serve"
    before = fallbacks(splicing_gateway)
    calls = chat_three_turns(splicing_gateway, new_id("splice"))

    after = fallbacks(splicing_gateway)
    assert after["spliced"] - before["spliced"] == 2
    for previous, call in itertools.pairwise(calls):
        prompt, response = previous["data"]["response"]["prompt_token_ids"], previous["data"]["response"]
        sampled_ids = response["choices"][0]["token_ids"]
        assert (
            call["data"]["response"]["prompt_token_ids"][: len(prompt) + len(sampled_ids)]
            == prompt + sampled_ids
        )
    assert [call["data"]["server"].get("exact_tokens", False) for call in calls] == [False, True, True]
    assert all("kv_transfer_params" not in call["data"]["request"] for call in calls)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "reason"), [("refuse", "engine_refused"), ("ignore", "engine_ignored")])
def test_an_engine_that_refuses_or_ignores_the_ids_still_answers_every_call_and_is_counted(
    splicing_gateway: Gateway, tokenizing: TokenizingEngine, new_id: Any, mode: str, reason: str
) -> None:
    tokenizing.mode = mode
    before = fallbacks(splicing_gateway)
    calls = chat_three_turns(splicing_gateway, new_id(mode))

    after = fallbacks(splicing_gateway)
    assert after[reason] - before[reason] == 2
    assert [call["data"]["status"] for call in calls] == ["ok"] * 3
    # A refused call was sent again as rendered, and is recorded as such.
    exact_flags = [call["data"]["server"].get("exact_tokens", False) for call in calls]
    assert exact_flags == ([False] * 3 if mode == "refuse" else [False, True, True])

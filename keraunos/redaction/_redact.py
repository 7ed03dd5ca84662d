"""Redaction of one call, event or log (pure): new data and the findings, never the secret.

The input is never changed: parts that hold a secret are copied with the secret replaced by
`[REDACTED:<rule>]`, the rest is shared. A finding says which rule matched, in which field and at
which path (`request.messages[2].content[0].text`), and how often; it never holds the matched text.

A model call with any finding takes its token ids with it (`tokens: untrainable`): the response's
`prompt_token_ids`, every choice's `token_ids` and `prompt_token_ids`, and the log probs (which
carry the sampled tokens' text) are removed, and `data["redaction"]` says so. Its prompt and its
response are therefore not stored as ids anywhere, so no stored id sequence decodes to the secret,
and the trainer has nothing to build a row from. A later call of the same conversation carries the
secret in its own prompt text, so it is redacted (and untrainable) in turn. With `tokens:
placeholder` the ids covering each secret are replaced by the placeholder's instead and choice 0's
replaced positions listed in `redaction.masked` (`keraunos.redaction._tokens`), falling back to
untrainable where that cannot be done faithfully.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keraunos.redaction._detectors import secret_span
from keraunos.redaction._policy import MODEL_CALL_FIELDS, CompiledPolicy
from keraunos.redaction._tokens import Replaced, TokenCodec, realign, replace_spans

#: `role`s whose message content is a tool's result (`function` is the legacy name).
TOOL_ROLES = frozenset(("tool", "function"))
#: Keys of a response choice (and of a stream chunk's choice) that hold ids or per-token log probs.
_CHOICE_TOKEN_KEYS = ("token_ids", "prompt_token_ids", "prompt_logprobs", "logprobs")
_RESPONSE_TOKEN_KEYS = ("prompt_token_ids", "prompt_logprobs")
#: Assistant text keys of a message or a stream delta.
_TEXT_KEYS = ("content", "reasoning_content", "reasoning", "refusal")


@dataclass(frozen=True, slots=True)
class Finding:
    """`count` matches of `rule` in `field` at `path`."""

    rule: str
    field: str
    path: str
    count: int

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "field": self.field, "path": self.path, "count": self.count}


@dataclass(frozen=True, slots=True)
class Redaction:
    """The redacted value and what was found in it (empty: the value came back unchanged)."""

    value: Any
    findings: tuple[Finding, ...]


class TextCache:
    """Texts already redacted, with what each rule found in them: an agent's calls resend the whole
    conversation, so each call would otherwise scan every earlier message again (about 0.4 us per
    character with the five detectors). Bounded by the characters it holds; the oldest go first.
    Only the gateway's own copy is ever written, by its event loop."""

    #: Texts shorter than this are scanned again: cheaper than keeping them.
    MIN_CHARS = 64

    def __init__(self, max_chars: int = 32 * 1024 * 1024) -> None:
        self.max_chars = max_chars
        self._held = 0
        self._entries: dict[tuple[str, str], _Scanned] = {}

    @property
    def held_chars(self) -> int:
        """Characters held (the texts and their redacted forms)."""
        return self._held

    def get(self, field: str, text: str) -> _Scanned | None:
        return self._entries.get((field, text))

    def put(self, field: str, text: str, scanned: _Scanned) -> None:
        self._entries[field, text] = scanned
        self._held += len(text) + len(scanned.text)
        while self._held > self.max_chars and self._entries:
            key = next(iter(self._entries))
            old = self._entries.pop(key)
            self._held -= len(key[1]) + len(old.text)


@dataclass(frozen=True, slots=True)
class _Scanned:
    """A text as redacted, what each rule found in it, and the matched texts with their placeholders
    (kept in memory only, for `tokens: placeholder` to find them in the call's ids)."""

    text: str
    counts: tuple[tuple[str, int], ...]
    secrets: tuple[tuple[str, str], ...]


class _Pass:
    """One redaction's state: the policy, the cache it may use, and the findings so far."""

    def __init__(self, policy: CompiledPolicy, cache: TextCache | None = None) -> None:
        self.policy = policy
        self.cache = cache
        self.findings: list[Finding] = []
        self.secrets: dict[str, str] = {}  # matched text -> its placeholder; never stored

    def matches(self, text: str) -> bool:
        """Whether any rule of a model call's fields still matches somewhere in `text`."""
        for field in MODEL_CALL_FIELDS:
            for rule in self.policy.rules(field):
                for match in rule.detector.pattern.finditer(text):
                    start, end = secret_span(match)
                    if end > start and (rule.detector.check is None or rule.detector.check(text[start:end])):
                        return True
        return False

    def text(self, field: str, path: str, text: str) -> str:
        """`text` with every match of the field's rules replaced, in the policy's order."""
        cache = self.cache if len(text) >= TextCache.MIN_CHARS else None
        if cache is not None:
            known = cache.get(field, text)
            if known is not None:
                self.findings.extend(Finding(rule, field, path, count) for rule, count in known.counts)
                self.secrets.update(known.secrets)
                return known.text
        original = text
        counts: list[tuple[str, int]] = []
        secrets: list[tuple[str, str]] = []
        for rule in self.policy.rules(field):
            pieces: list[str] = []
            last = count = 0
            for match in rule.detector.pattern.finditer(text):
                start, end = secret_span(match)
                if end <= start or (
                    rule.detector.check is not None and not rule.detector.check(text[start:end])
                ):
                    continue
                pieces.append(text[last:start])
                pieces.append(rule.placeholder)
                secrets.append((text[start:end], rule.placeholder))
                last = end
                count += 1
            if count:
                pieces.append(text[last:])
                text = "".join(pieces)
                counts.append((rule.name, count))
        self.findings.extend(Finding(rule, field, path, count) for rule, count in counts)
        self.secrets.update(secrets)
        if cache is not None:
            cache.put(field, original, _Scanned(text, tuple(counts), tuple(secrets)))
        return text

    def value(self, field: str, path: str, value: Any) -> Any:
        """Every string inside `value` (any nesting of lists and objects) redacted; keys are kept."""
        if isinstance(value, str):
            return self.text(field, path, value)
        if isinstance(value, list):
            out = [self.value(field, f"{path}[{i}]", item) for i, item in enumerate(value)]
            return value if all(a is b for a, b in zip(out, value, strict=True)) else out
        if isinstance(value, dict):
            changed = {k: self.value(field, f"{path}.{k}", v) for k, v in value.items()}
            return value if all(changed[k] is v for k, v in value.items()) else changed
        return value

    def keys(self, field: str, path: str, obj: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        """`obj` with the values of `keys` redacted (a copy only when something changed)."""
        out = obj
        for key in keys:
            if key in obj:
                new = self.value(field, f"{path}.{key}", obj[key])
                if new is not obj[key]:
                    if out is obj:
                        out = dict(obj)
                    out[key] = new
        return out

    def tool_calls(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` (a message or delta) with its tool calls' (and legacy function call's) arguments redacted."""
        out = obj
        calls = obj.get("tool_calls")
        if isinstance(calls, list):
            new_calls = list(calls)
            for i, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    new_function = self.keys(
                        "tool_arguments", f"{path}.tool_calls[{i}].function", function, ("arguments",)
                    )
                    if new_function is not function:
                        new_calls[i] = {**call, "function": new_function}
            if any(a is not b for a, b in zip(new_calls, calls, strict=True)):
                out = {**out, "tool_calls": new_calls}
        function_call = obj.get("function_call")
        if isinstance(function_call, dict):
            new = self.keys("tool_arguments", f"{path}.function_call", function_call, ("arguments",))
            if new is not function_call:
                out = {**out, "function_call": new}
        return out


def redact_text(policy: CompiledPolicy, field: str, text: str) -> Redaction:
    """`text` redacted by the rules of `field` (`logs`, say); the path of its findings is `field`."""
    run = _Pass(policy)
    return Redaction(run.text(field, field, text), tuple(run.findings))


def redact_event_data(
    policy: CompiledPolicy, data: dict[str, Any], cache: TextCache | None = None
) -> Redaction:
    """An agent's event data with every string in it redacted (`event_data`); when something was
    found, `redaction: {findings}` is added to it."""
    run = _Pass(policy, cache)
    value = run.value("event_data", "data", data)
    if not run.findings:
        return Redaction(data, ())
    findings = tuple(run.findings)
    return Redaction({**value, "redaction": {"findings": [f.as_json() for f in findings]}}, findings)


def redact_model_request(
    policy: CompiledPolicy, data: dict[str, Any], cache: TextCache | None = None
) -> Redaction:
    """`model_request` data with its request messages, tool arguments, tool results and response
    text redacted; with any finding, the call's token ids and log probs removed and
    `redaction: {untrainable: true, findings}` added (see the module's docstring). `cache` (the
    gateway's) spares scanning a conversation's earlier messages again; the result is the same."""
    run = _Pass(policy, cache)
    out = data
    request = data.get("request")
    if isinstance(request, dict):
        new_request = _request(run, request)
        if new_request is not request:
            out = {**out, "request": new_request}
    response = data.get("response")
    new_response = _response(run, response)
    if not run.findings:
        return Redaction(data, ())
    findings = tuple(run.findings)
    found = [f.as_json() for f in findings]
    if policy.codec is not None:
        placed = _with_placeholders(run, policy.codec, new_response)
        if placed is not None:
            response, masked = placed
            return Redaction(
                {**out, "response": response, "redaction": {"masked": masked, "findings": found}}, findings
            )
    out = {
        **out,
        "response": _without_tokens(new_response),
        "redaction": {"untrainable": True, "findings": found},
    }
    return Redaction(out, findings)


def _with_placeholders(run: _Pass, codec: TokenCodec, response: Any) -> tuple[Any, list[int]] | None:
    """`tokens: placeholder`: the response with every id sequence's secrets replaced by their
    placeholders' ids, chat log probs laid out along (0 and no alternatives where replaced; none
    kept for completions), and choice 0's replaced positions; None where any sequence cannot be
    (the call is then made untrainable)."""
    if not isinstance(response, dict):
        return (response, []) if response is None else None  # legacy stream chunks: untrainable
    secrets = run.secrets
    out = {k: v for k, v in response.items() if k != "prompt_logprobs"}
    if isinstance(out.get("prompt_token_ids"), list):
        replaced = replace_spans(codec, out["prompt_token_ids"], secrets, run.matches)
        if replaced is None:
            return None
        out["prompt_token_ids"] = replaced.ids
    masked: list[int] = []
    choices = out.get("choices")
    if isinstance(choices, list):
        new_choices: list[Any] = []
        for index, choice in enumerate(choices):
            if not isinstance(choice, dict):
                new_choices.append(choice)
                continue
            new = {k: v for k, v in choice.items() if k != "prompt_logprobs"}
            if isinstance(new.get("prompt_token_ids"), list):
                replaced = replace_spans(codec, new["prompt_token_ids"], secrets, run.matches)
                if replaced is None:
                    return None
                new["prompt_token_ids"] = replaced.ids
            ids = new.get("token_ids")
            if isinstance(ids, list):
                replaced = replace_spans(codec, ids, secrets, run.matches)
                if replaced is None or (replaced.positions and index > 0):
                    return None  # only choice 0's positions reach the trainer (the triplet's own)
                new["token_ids"] = replaced.ids
                new["logprobs"] = _realigned_logprobs(new.get("logprobs"), replaced, codec)
                if index == 0:
                    masked = replaced.positions
            elif "logprobs" in new:
                new["logprobs"] = None  # no ids to lay them along
            new_choices.append(new)
        out["choices"] = new_choices
    return out, masked


def _realigned_logprobs(logprobs: Any, replaced: Replaced, codec: TokenCodec) -> Any:
    """Chat log probs laid out along the new ids (a replaced position: its placeholder token,
    log prob 0, no alternatives; alternatives dropped everywhere, as they may spell a secret's
    pieces); None for any other shape."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    laid = realign(content, replaced, lambda: None)
    if laid is None:
        return None
    entries: list[Any] = []
    for position, entry in enumerate(laid):
        if entry is None:
            token = codec.decode([replaced.ids[position]])
            entries.append({"token": token, "logprob": 0.0, "bytes": None, "top_logprobs": []})
        elif isinstance(entry, dict):
            entries.append({**entry, "top_logprobs": []})
        else:
            return None
    return {**logprobs, "content": entries}


def _request(run: _Pass, request: dict[str, Any]) -> dict[str, Any]:
    out = request
    messages = request.get("messages")
    if isinstance(messages, list):
        new_messages = [_message(run, f"request.messages[{i}]", m) for i, m in enumerate(messages)]
        if any(a is not b for a, b in zip(new_messages, messages, strict=True)):
            out = {**out, "messages": new_messages}
    if "prompt" in request:  # completions: a string, or a list of strings (ids pass unchanged)
        prompt = run.value("messages", "request.prompt", request["prompt"])
        if prompt is not request["prompt"]:
            out = {**out, "prompt": prompt}
    return out


def _message(run: _Pass, path: str, message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    field = "tool_results" if message.get("role") in TOOL_ROLES else "messages"
    out = run.keys(field, path, message, _TEXT_KEYS)
    return run.tool_calls(path, out)


def _response(run: _Pass, response: Any) -> Any:
    if isinstance(response, list):  # the legacy record of raw stream chunks
        chunks = [_response(run, chunk) for chunk in response]
        return response if all(a is b for a, b in zip(chunks, response, strict=True)) else chunks
    if not isinstance(response, dict):
        return response
    out = response
    choices = response.get("choices")
    if isinstance(choices, list):
        new_choices = [_choice(run, f"response.choices[{i}]", c) for i, c in enumerate(choices)]
        if any(a is not b for a, b in zip(new_choices, choices, strict=True)):
            out = {**out, "choices": new_choices}
    error = response.get("error")
    if isinstance(error, dict):
        new_error = run.keys("response", "response.error", error, ("message",))
        if new_error is not error:
            out = {**out, "error": new_error}
    return out


def _choice(run: _Pass, path: str, choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    out = run.keys("response", path, choice, ("text",))
    for key in ("message", "delta"):
        inner = choice.get(key)
        if isinstance(inner, dict):
            new = run.tool_calls(f"{path}.{key}", run.keys("response", f"{path}.{key}", inner, _TEXT_KEYS))
            if new is not inner:
                out = {**out, key: new}
    return out


def _without_tokens(response: Any) -> Any:
    """`response` without token ids or log probs anywhere (ids removed, `logprobs` set to None)."""
    if isinstance(response, list):
        return [_without_tokens(chunk) for chunk in response]
    if not isinstance(response, dict):
        return response
    out = {k: v for k, v in response.items() if k not in _RESPONSE_TOKEN_KEYS}
    choices = out.get("choices")
    if isinstance(choices, list):
        out["choices"] = [_choice_without_tokens(c) for c in choices]
    return out


def _choice_without_tokens(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    out = {k: v for k, v in choice.items() if k not in _CHOICE_TOKEN_KEYS}
    if "logprobs" in choice:
        out["logprobs"] = None  # as an engine answers when none were asked for
    return out

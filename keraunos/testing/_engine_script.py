"""Scripted chat replies of the engine stand-in (`keraunos engine-mock --script FILE`).

A coding harness (Claude Code, Codex CLI) only does something worth recording when the model asks
for a tool and then finishes, which generated `w<id>` words never do. A script is a list of rules
in a YAML or JSON file; the first rule whose `when` matches a chat request decides the reply, and a
request no rule matches gets the generated tokens as without a script:

    - when: {role: tool}                  # the last message is a tool result
      reply: {text: "Done."}
    - when: {contains: "out.txt", model: coder}
      reply:
        tool_calls:
          - {name: Write, arguments: {file_path: /tmp/out.txt, content: hello}}

`when` keys, all optional and all required to hold: `contains` (a substring of the last message's
text), `regex` (searched in that text), `role` (the last message's role), `model` (the requested
model name). An empty `when` matches every request. `reply` has `text` and/or `tool_calls`, each
`{name, arguments}` with `arguments` an object (sent as its JSON) or a string (sent verbatim).

The reply's token ids are the stand-in tokenizer's ids of the message as an agent sends it back
(its text, then each call's name and arguments: `_engine_tokens._message_text`), so a scripted turn
keeps the prompt-grows-by-the-response property the gateway's exact-token continuation relies on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from keraunos._settings import ConfigError
from keraunos.testing._engine_tokens import message_text

__all__ = ["Script", "ScriptReply", "ScriptRule", "ScriptToolCall", "ScriptWhen", "load_script"]


class ScriptWhen(BaseModel):
    """What a request must look like for its rule to apply; every key given must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    contains: str | None = Field(default=None, description="A substring of the last message's text.")
    regex: str | None = Field(default=None, description="A regular expression searched in that text.")
    role: str | None = Field(default=None, description="The last message's role.")
    model: str | None = Field(default=None, description="The model name the request asks for.")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc})") from None
        return value

    def matches(self, messages: list[Any], model: str) -> bool:
        if self.model is not None and model != self.model:
            return False
        last = messages[-1]
        if self.role is not None and last.get("role") != self.role:
            return False
        if self.contains is None and self.regex is None:
            return True
        text = message_text(last, len(messages) - 1)
        if self.contains is not None and self.contains not in text:
            return False
        return self.regex is None or re.search(self.regex, text) is not None


class ScriptToolCall(BaseModel):
    """One tool call of a scripted reply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)

    @property
    def arguments_text(self) -> str:
        """The `function.arguments` string: an object's JSON, or the string as given."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


class ScriptReply(BaseModel):
    """The assistant message a matching request gets: text, tool calls, or both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str | None = None
    tool_calls: tuple[ScriptToolCall, ...] = ()

    @model_validator(mode="after")
    def _says_something(self) -> ScriptReply:
        if self.text is None and not self.tool_calls:
            raise ValueError("a reply needs 'text' or 'tool_calls'")
        return self

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


class ScriptRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    when: ScriptWhen = Field(default_factory=ScriptWhen)
    reply: ScriptReply


_RULES = TypeAdapter(list[ScriptRule])


class Script:
    """The loaded rules, first match wins."""

    def __init__(self, rules: Sequence[ScriptRule]) -> None:
        self.rules = tuple(rules)

    def reply_for(self, messages: list[Any], model: str) -> ScriptReply | None:
        """The reply of the first rule matching a (validated, non-empty) chat request, or None."""
        for rule in self.rules:
            if rule.when.matches(messages, model):
                return rule.reply
        return None


def load_script(path: str | Path) -> Script:
    """The rules in a YAML or JSON file; `ConfigError` naming the file and the problem otherwise."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read script {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"script {path} is neither YAML nor JSON: {first_line}") from None
    try:
        rules = _RULES.validate_python(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the top level"
        raise ConfigError(
            f"script {path} must be a list of {{when, reply}} rules: {where}: {error['msg']}"
        ) from None
    return Script(rules)


def reply_pieces(reply: ScriptReply, call_ids: Sequence[str]) -> list[tuple[dict[str, Any], str]]:
    """The stream deltas of a scripted reply, each with the text its token ids are the words of.

    As a real engine streams them: the text word by word, then per tool call a first delta with its
    id and name, and its arguments in pieces (one per whitespace-separated word, whitespace kept),
    so the concatenation of the pieces is exactly the message.
    """
    pieces: list[tuple[dict[str, Any], str]] = []
    for word in _words(reply.text or ""):
        pieces.append(({"content": word}, word))
    for index, (call, ident) in enumerate(zip(reply.tool_calls, call_ids, strict=True)):
        head = {"index": index, "id": ident, "type": "function", "function": {"name": call.name}}
        pieces.append(({"tool_calls": [head]}, call.name))
        for word in _words(call.arguments_text):
            pieces.append(({"tool_calls": [{"index": index, "function": {"arguments": word}}]}, word))
    return pieces


def _words(text: str) -> list[str]:
    """`text` cut before each word, whitespace kept with the word after it (trailing with the last)."""
    words = re.findall(r"\s*\S+", text)
    if not words:
        return [text] if text else []
    rest = len(text) - sum(map(len, words))
    if rest:
        words[-1] += text[-rest:]
    return words

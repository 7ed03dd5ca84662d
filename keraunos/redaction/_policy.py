"""A redaction policy: its file format (pydantic), its digest, and its compiled form (pure but for `load_policy`).

The policy is read once when the gateway starts and compiled once: each rule's pattern is compiled
and the rules are grouped by the field they apply to, in the policy's order (a later rule sees the
earlier rules' placeholders, never the secret).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keraunos._settings import ConfigError
from keraunos.redaction._detectors import DETECTORS, Detector
from keraunos.redaction._tokens import TokenCodec

#: Where a rule applies. `messages`: the contents of a model call's request messages (any nesting
#: of content parts) and a completions prompt; `tool_arguments`: tool call arguments in requests and
#: responses; `tool_results`: the contents of tool-role messages; `response`: the assistant's text
#: (and an error body's message); `event_data`: events agents post; `logs`: attempt logs.
RedactionField = Literal["messages", "tool_arguments", "tool_results", "response", "event_data", "logs"]
FIELDS: tuple[RedactionField, ...] = (
    "messages",
    "tool_arguments",
    "tool_results",
    "response",
    "event_data",
    "logs",
)
#: The fields whose text reaches a model call's prompt or response (and so its token ids).
MODEL_CALL_FIELDS: frozenset[str] = frozenset(("messages", "tool_arguments", "tool_results", "response"))

DetectorName = Literal["email", "phone", "api_key", "credit_card", "ipv4"]
TokenPolicy = Literal["untrainable", "placeholder"]


class RedactionRule(BaseModel):
    """One rule: a named detector or a regular expression, the fields it applies to, and its name
    (the `<rule>` of the `[REDACTED:<rule>]` placeholder and of the metrics' label)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The rule's name; defaults to the detector's name (required with a pattern).",
    )
    detector: DetectorName | None = Field(default=None, description="A named detector.")
    pattern: str | None = Field(
        default=None,
        description="A Python regular expression; a group named `secret` redacts only that group.",
    )
    ignore_case: bool = Field(default=False, description="Match `pattern` regardless of case.")
    fields: tuple[RedactionField, ...] = Field(default=FIELDS, min_length=1, description="Where it applies.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compiled = re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a regular expression: {exc}") from None
            if compiled.match(""):
                raise ValueError(f"pattern {value!r} matches the empty string, which would redact nothing")
        return value

    @model_validator(mode="after")
    def _one_matcher(self) -> RedactionRule:
        if (self.detector is None) == (self.pattern is None):
            raise ValueError("a rule has either 'detector' or 'pattern', not both nor neither")
        if self.pattern is not None and self.name is None:
            raise ValueError("a rule with a 'pattern' needs a 'name'")
        return self

    @property
    def rule_name(self) -> str:
        """The name findings and placeholders carry."""
        return self.name or str(self.detector)


class RedactionPolicy(BaseModel):
    """What the gateway redacts before it commits anything, and what becomes of a redacted call's
    token ids (`tokens`): `untrainable` removes them (and their log probs) from the stored call and
    marks it, so no stored id sequence decodes to a secret and the trainer builds no row from it;
    `placeholder` (with a tokenizer) replaces the ids covering each secret by the placeholder's ids
    and lists those response positions for the trainer to mask, falling back to `untrainable`
    for a call where that cannot be done faithfully (`keraunos.redaction._tokens`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: TokenPolicy = Field(
        default="untrainable",
        description="What becomes of a redacted call's ids: untrainable or placeholder.",
    )
    rules: tuple[RedactionRule, ...] = Field(min_length=1, description="Applied in this order.")

    @model_validator(mode="after")
    def _unique_names(self) -> RedactionPolicy:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.rule_name in seen:
                raise ValueError(f"the rule name {rule.rule_name!r} is used twice; give each rule its own")
            seen.add(rule.rule_name)
        return self

    def digest(self) -> str:
        """`sha256:<hex>` of the policy's canonical JSON: what the start-up audit entry records."""
        canonical = orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        return "sha256:" + hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule ready to run: its name, placeholder and detector (pattern and optional check)."""

    name: str
    placeholder: str
    detector: Detector


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A policy compiled once: per field, the rules that apply there, in the policy's order."""

    policy: RedactionPolicy
    by_field: dict[str, tuple[CompiledRule, ...]]
    #: `tokens: placeholder`: the serving model's tokenizer (None otherwise).
    codec: TokenCodec | None = None

    def rules(self, field: str) -> tuple[CompiledRule, ...]:
        return self.by_field.get(field, ())


def compile_policy(policy: RedactionPolicy, codec: TokenCodec | None = None) -> CompiledPolicy:
    """Compile each rule's pattern once and group the rules by field; `codec` is the tokenizer
    `tokens: placeholder` needs (and only it takes)."""
    if (policy.tokens == "placeholder") != (codec is not None):
        raise ConfigError(
            "a redaction policy with 'tokens: placeholder' needs the serving model's tokenizer "
            "(--redaction-tokenizer DIR), and only such a policy takes one"
        )
    compiled: list[tuple[RedactionRule, CompiledRule]] = []
    for rule in policy.rules:
        if rule.detector is not None:
            detector = DETECTORS[rule.detector]
        else:
            assert rule.pattern is not None  # the model's validator
            detector = Detector(re.compile(rule.pattern, re.IGNORECASE if rule.ignore_case else 0))
        compiled.append((rule, CompiledRule(rule.rule_name, f"[REDACTED:{rule.rule_name}]", detector)))
    by_field = {field: tuple(c for rule, c in compiled if field in rule.fields) for field in FIELDS}
    return CompiledPolicy(policy, by_field, codec)


def load_policy(path: Path, tokenizer: Path | None = None) -> CompiledPolicy:
    """The compiled policy of the YAML (or JSON) file at `path`, with the Hugging Face tokenizer
    directory `tokenizer` loaded once for `tokens: placeholder`; `ConfigError` in one line otherwise."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read redaction policy {path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise ConfigError(f"redaction policy {path} is not valid YAML or JSON: {first_line}") from None
    try:
        policy = RedactionPolicy.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the file"
        raise ConfigError(f"redaction policy {path}: {where}: {error['msg']}") from None
    codec = None
    if tokenizer is not None and policy.tokens == "placeholder":
        from keraunos._tokenizer_file import TokenizerFile

        codec = TokenizerFile(tokenizer, purpose="redaction tokenizer")
    elif tokenizer is not None:
        raise ConfigError(
            f"--redaction-tokenizer is only used by a policy with 'tokens: placeholder'; {path} has none"
        )
    return compile_policy(policy, codec)

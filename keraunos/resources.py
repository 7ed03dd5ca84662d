"""Versioned resources and their labels (docs/protocol.md#resources): the shapes and the pure rules.

A *resource* is a named thing a rollout uses and training changes: a prompt template, a weights
reference, a sampling config, or a bundle of these. Each push of new content makes an immutable
*version* (1, 2, ...) identified by the hash of its content, with a message and a parent. A *label*
(`production`, `candidate`, any name) points at one version of one resource and moves only by a
recorded step (an audit entry in the same transaction, `keraunos.audit`).

This module holds the wire models, the content hash, the kind rules and the diff; the ledger stores
them (`Ledger.push_resource`, `Ledger.move_label`), the gateway serves them (`/api/resources`).
Nothing here does I/O.
"""

from __future__ import annotations

import difflib
import hashlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keraunos.errors import InputError
from keraunos.protocol import Id

#: The kinds of resource, and what their content is (`CONTENT_MODELS`).
ResourceKind = Literal["prompt", "weights", "sampling", "bundle"]

#: Longest push message or label-move reason kept (longer text is refused, not cut).
MAX_MESSAGE_CHARS = 4096

#: A version number: 1 for a resource's first push, then one more per push of new content.
VersionNumber = Annotated[int, Field(ge=1, lt=2**63)]


class InvalidResource(InputError):
    """Resource content that does not fit its kind, or a push or label move that cannot be read."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"resource {name!r}: {why}")
        self.name = name
        self.why = why


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptContent(_Strict):
    """A prompt template: text with `{placeholder}` fields (Python `str.format` syntax)."""

    template: str = Field(min_length=1)


class WeightsContent(_Strict):
    """Where trained weights are, and the name and version engines serve them under."""

    location: str = Field(min_length=1, description="checkpoint directory or adapter path / URI")
    model: str = Field(min_length=1, description="the model name engines serve these weights as")
    model_version: int | None = Field(default=None, ge=0, description="the engines' weights version")
    adapter: bool = Field(default=False, description="a LoRA adapter over `base`, not full weights")
    base: str | None = Field(default=None, description="the base model an adapter applies to")


class SamplingContent(_Strict):
    """Sampling settings an agent passes to its model calls (unset fields: the engine's default)."""

    temperature: float | None = Field(default=None, ge=0, le=10)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: list[str] | None = None


class BundleContent(_Strict):
    """Several resources pinned together: member name -> version."""

    members: dict[Id, VersionNumber] = Field(min_length=1)


CONTENT_MODELS: dict[str, type[BaseModel]] = {
    "prompt": PromptContent,
    "weights": WeightsContent,
    "sampling": SamplingContent,
    "bundle": BundleContent,
}


class ResourcePush(_Strict):
    """Body of `POST /api/resources/{name}`: new content for a resource (created on its first push)."""

    kind: ResourceKind
    content: dict[str, Any]
    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    parent: VersionNumber | None = Field(
        default=None, description="the version this one derives from; the latest when omitted"
    )


class ResourceVersion(BaseModel):
    """One immutable version of a resource."""

    name: str
    version: int
    kind: ResourceKind
    content: dict[str, Any]
    hash: str
    message: str
    parent: int | None
    created_at: float
    created_by: str


class PushResult(BaseModel):
    """Answer of a push: the version, and whether this push made it (False: same content as the latest)."""

    created: bool
    version: ResourceVersion


class Label(BaseModel):
    """A movable name for one version of a resource."""

    name: str
    label: str
    version: int
    updated_at: float
    updated_by: str


class LabelMove(_Strict):
    """Body of `PUT /api/resources/{name}/labels/{label}`: point the label at `version`.

    `expected` makes the move a compare-and-set: the label must point at that version now (0: the
    label must not exist yet), or the move is refused with 409 and nothing changes.
    """

    version: VersionNumber
    expected: int | None = Field(default=None, ge=0)
    reason: str = Field(default="", max_length=MAX_MESSAGE_CHARS)


class ResourceSummary(BaseModel):
    """One resource in `GET /api/resources`: its kind, latest version and labels."""

    name: str
    kind: ResourceKind
    latest: int
    labels: dict[str, int]
    updated_at: float


def normalized_content(name: str, kind: str, content: dict[str, Any]) -> dict[str, Any]:
    """`content` checked against its kind's model and written out canonically (unset fields left out).

    Raises `InvalidResource` naming every problem.
    """
    model = CONTENT_MODELS.get(kind)
    if model is None:
        raise InvalidResource(name, f"unknown kind {kind!r}; use one of {', '.join(CONTENT_MODELS)}")
    try:
        parsed = model.model_validate(content)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'content'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidResource(name, f"{kind} content: {problems}") from None
    return parsed.model_dump(mode="json", exclude_none=True)


def content_hash(kind: str, content: dict[str, Any]) -> str:
    """The identity of a version's content: sha256 over its kind and canonical (sorted-key) JSON."""
    canonical = orjson.dumps({"kind": kind, "content": content}, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def diff_versions(old: ResourceVersion, new: ResourceVersion) -> str:
    """A unified diff from `old` to `new`: of the template lines for prompts, else of sorted JSON."""

    def lines(version: ResourceVersion) -> list[str]:
        if version.kind == "prompt":
            text = str(version.content.get("template", ""))
        else:
            text = orjson.dumps(version.content, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()
        return text.splitlines(keepends=True)

    # A last line without its newline is marked as diff and patch mark it, or it would run into the
    # next line of the output ("-old+new").
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(
            lines(old),
            lines(new),
            fromfile=f"{old.name}@{old.version}",
            tofile=f"{new.name}@{new.version}",
        )
    )


def render_prompt(version: ResourceVersion, **fields: Any) -> str:
    """A prompt version's template with `fields` filled in (`str.format`); `InvalidResource` when one
    is missing or the template is not a format string."""
    if version.kind != "prompt":
        raise InvalidResource(version.name, f"is a {version.kind} resource, not a prompt")
    try:
        return str(version.content["template"]).format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise InvalidResource(version.name, f"version {version.version} does not render: {exc!r}") from None

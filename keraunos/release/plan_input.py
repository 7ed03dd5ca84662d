"""A release's plan and replay inputs, from a plan file and options: one reading for two callers.

`keraunos release start` (its flags) and `keraunos train` (its `release_*` fields) read them here:
one set of checks and one message per mistake, so both refuse the same input the same way before
anything is sent.

The plan file is YAML, or JSON by its `.json` suffix, mapping `ReleasePlan`'s fields; the options
override its fields. Replay inputs are a JSONL file of `POST /api/rollouts` items without
`resources` (the release assigns the versions). A mistake raises `PlanInputError` naming the file
and line, or the option as the caller spells it (`OptionNames`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from keraunos.errors import InputError
from keraunos.protocol import RolloutCreate
from keraunos.release.plan import ReleasePlan


class PlanInputError(InputError):
    """A plan file, replay file or plan option that does not make a plan (the message names it)."""


@dataclass(frozen=True, slots=True)
class OptionNames:
    """How the caller spells the options in its messages (flags for the CLI, fields for a config)."""

    stages: str = "--stages"
    replay_file: str = "--replay-file"
    replay_pairs: str = "--replay-pairs"


@dataclass(frozen=True, slots=True)
class StartPlan:
    """What `POST /api/releases` gets besides the resource, label and candidate: the checked plan
    and the replay inputs (JSON objects, empty without a replay)."""

    plan: ReleasePlan
    replay_items: list[dict[str, Any]] = field(default_factory=list)

    def plan_json(self) -> dict[str, Any]:
        return self.plan.model_dump(mode="json")


def start_plan(
    *,
    plan_file: Path | None = None,
    stages: str | None = None,
    min_stage_rollouts: int | None = None,
    approve_promotion: bool | None = None,
    replay_file: Path | None = None,
    replay_pairs: int | None = None,
    names: OptionNames = OptionNames(),
) -> StartPlan:
    """The plan of the file (the default plan without one) with the options on top, checked, and
    the replay inputs; `PlanInputError` for the first mistake found."""
    plan: dict[str, Any] = read_plan_file(plan_file) if plan_file is not None else {}
    if stages is not None:
        plan["stages"] = parse_stages(stages, names)
    if min_stage_rollouts is not None:
        plan["min_stage_rollouts"] = min_stage_rollouts
    if approve_promotion is not None:
        plan["approve_promotion"] = approve_promotion
    items = read_replay_items(replay_file) if replay_file is not None else []
    if replay_pairs is not None and not items:
        raise PlanInputError(f"{names.replay_pairs} needs {names.replay_file}: the inputs the replay re-runs")
    if items:
        pairs = replay_pairs or (plan.get("replay") or {}).get("pairs") or len(items)
        plan["replay"] = {**(plan.get("replay") or {}), "pairs": pairs}
    elif plan.get("replay"):
        raise PlanInputError(f"the plan has a replay: give its inputs with {names.replay_file}")
    return StartPlan(checked_plan(plan), items)


#: The config fields of a release started at the end of a run (`keraunos train`, `keraunos
#: optimize`), besides `release_label`: they shape its plan and mean nothing without the label.
RELEASE_FIELDS = (
    "release_plan",
    "release_stages",
    "release_min_stage_rollouts",
    "release_approve_promotion",
    "release_replay_file",
    "release_replay_pairs",
)
_FIELD_NAMES = OptionNames(
    stages="release_stages", replay_file="release_replay_file", replay_pairs="release_replay_pairs"
)


def release_fields_plan(config: Any) -> StartPlan | None:
    """The plan of a config's `release_*` fields (`RELEASE_FIELDS`), None without `release_label`;
    `ValueError` naming the fields given without it, `PlanInputError` for a plan that is wrong."""
    given = [name for name in RELEASE_FIELDS if getattr(config, name) not in ("", None)]
    if not config.release_label:
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} release_label: the label the release moves")
        return None
    return start_plan(
        plan_file=Path(config.release_plan) if config.release_plan else None,
        stages=config.release_stages or None,
        min_stage_rollouts=config.release_min_stage_rollouts,
        approve_promotion=config.release_approve_promotion,
        replay_file=Path(config.release_replay_file) if config.release_replay_file else None,
        replay_pairs=config.release_replay_pairs,
        names=_FIELD_NAMES,
    )


def read_plan_file(path: Path) -> dict[str, Any]:
    """The mapping a plan file holds (YAML, or JSON by its suffix); empty for an empty file."""
    text = _read_text(path)
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise PlanInputError(f"{path} does not parse: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PlanInputError(
            f"{path} must hold a mapping of the plan's fields (stages, min_stage_rollouts, ...)"
        )
    return data


def read_replay_items(path: Path) -> list[dict[str, Any]]:
    """The rollouts a replay re-runs, one `RolloutCreate` JSON object a line (no `resources`: the
    release assigns the versions)."""
    items: list[dict[str, Any]] = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = RolloutCreate.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "line"
            raise PlanInputError(f"{path}:{number}: {where}: {first['msg']}") from None
        if item.resources is not None:
            raise PlanInputError(
                f"{path}:{number}: a replay item names no resources (the release assigns them)"
            )
        items.append(item.model_dump(mode="json", exclude_none=True, exclude={"resources"}))
    if not items:
        raise PlanInputError(f"{path} holds no replay items (one rollout JSON object a line)")
    return items


def parse_stages(text: str, names: OptionNames = OptionNames()) -> list[float]:
    """`0.05,0.25,0.5` as shares (their order and range are the plan's to check)."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PlanInputError(
            f"{names.stages} {text!r}: give shares separated by commas, e.g. 0.05,0.25,0.5"
        ) from None


def checked_plan(plan: dict[str, Any]) -> ReleasePlan:
    """The plan validated here (the gateway checks too; this names the field before a round trip)."""
    try:
        return ReleasePlan.model_validate(plan)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in ("plan", *first["loc"]))
        raise PlanInputError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"cannot read {path}: {exc}") from None

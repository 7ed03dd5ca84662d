"""One `keraunos optimize` run, read top to bottom: data, seams, search, record, release.

1. Read the instances (`dataset`, and `val_dataset` or the dataset's last `val_size`).
2. Read the start version's template from the gateway; build the seams: evaluations as val-mode
   rollouts (`GatewayEvaluator`), candidates as versions of the prompt resource
   (`GatewayCandidateStore`), the optimizer model (`ModelProposer`), each of its calls appended to
   the audit log (`GatewayCallLog`) and, for a resumed run, its earlier calls answered from there.
3. Run the search (`run_search`) with a progress bar of evaluations spent and the best score.
4. Write `RUN_DIR/candidates.jsonl` (every candidate, lineage and per-instance scores),
   `score.png` (best validation score against evaluations spent) and `summary.json`.
5. When the winner beats the start on validation: move `candidate_label` to it, and with
   `release_label` start a release of it (`start_release_once`: a resumed run starts none twice),
   its replay gate over the validation inputs unless a replay file was given. The winner never
   reaches `release_label` without that release.

Steps 2 to 5 are `search_and_release`, which online mode (keraunos/optimize/online.py) runs once
per window of production data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import structlog

from keraunos.controller._urls import path_segment
from keraunos.errors import InputError
from keraunos.optimize.config import OptimizeConfig
from keraunos.optimize.gateway import GatewayCandidateStore, GatewayEvaluator
from keraunos.optimize.proposer import GatewayCallLog, ModelProposer, read_answers
from keraunos.optimize.scoreboard import Progress, SearchResult
from keraunos.optimize.search import SearchConfig, run_search
from keraunos.optimize.types import Instance
from keraunos.release.plan import ReplayPlan
from keraunos.release.plan_input import StartPlan
from keraunos.release.start_once import detail, release_id_of, skipped, start_release_once

log = structlog.get_logger("keraunos.optimize")


class DatasetError(InputError):
    """A dataset file cannot be read as instances (the message names the file and line)."""


def read_instances(path: Path) -> list[Instance]:
    """The instances of a JSONL file: `{"id", "input"}` objects, or any JSON value as the input
    (its 1-based line number then its id)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from None
    instances: list[Instance] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{path}:{number}: not JSON: {exc}") from None
        if isinstance(value, dict) and "input" in value and set(value) <= {"id", "input"}:
            instances.append(Instance(id=str(value.get("id", number)), input=value["input"]))
        else:
            instances.append(Instance(id=str(number), input=value))
    if not instances:
        raise DatasetError(f"{path} holds no instances (one JSON value a line)")
    return instances


def splits(config: OptimizeConfig) -> tuple[list[Instance], list[Instance]]:
    """(train, val): the val file's instances, else the dataset's last `val_size`."""
    instances = read_instances(Path(config.dataset))
    if config.val_dataset:
        return instances, read_instances(Path(config.val_dataset))
    if len(instances) <= config.val_size:
        raise DatasetError(
            f"{config.dataset} holds {len(instances)} instances: val_size {config.val_size} leaves "
            "none to train on; lower val_size or give val_dataset"
        )
    return instances[: -config.val_size], instances[-config.val_size :]


def run_id_of(config: OptimizeConfig) -> str:
    """The run's id: the configured one, else a digest of what defines the run."""
    if config.run_id:
        return config.run_id
    defining = config.model_dump(
        include={
            "gateway",
            "resource",
            "start",
            "dataset",
            "val_dataset",
            "val_size",
            *SearchConfig.model_fields,
            *(("online_window_s",) if config.online else ()),
        }
    )
    return "opt-" + hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:12]


def prepare(config: OptimizeConfig) -> tuple[str, Path, list[Instance], list[Instance]]:
    """The run's id, its directory (made), and its train and validation instances."""
    run_id = run_id_of(config)
    run_dir = Path(config.run_dir or Path("runs") / run_id)
    train, val = splits(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_id, run_dir, train, val


async def optimize(config: OptimizeConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Run the search of `config` against its gateway; the summary (also in RUN_DIR/summary.json)."""
    run_id, run_dir, train, val = prepare(config)
    async with gateway_client(config) as client:
        return await search_and_release(client, config, run_id, run_dir, train, val, progress)


def gateway_client(config: OptimizeConfig) -> httpx.AsyncClient:
    """A client of the gateway with the run's key."""
    headers = {"Authorization": f"Bearer {config.key}"} if config.key else {}
    return httpx.AsyncClient(base_url=config.gateway, headers=headers, timeout=30.0)


async def search_and_release(
    client: httpx.AsyncClient,
    config: OptimizeConfig,
    run_id: str,
    run_dir: Path,
    train: list[Instance],
    val: list[Instance],
    progress: Progress | None = None,
    *,
    release_blocked: str | None = None,
) -> dict[str, Any]:
    """Steps 2 to 5 on these instances, as run `run_id` writing to `run_dir`: the summary. With
    `release_blocked` (why), the winner is stored and labelled but no release is started."""
    store = GatewayCandidateStore(client, resource=config.resource, run_id=run_id)
    start_version, seed_template = await store.current(config.start)
    evaluator = GatewayEvaluator(
        client,
        run_id=run_id,
        resource=config.resource,
        rollout_config=config.rollout_config_json(),
        poll_interval_s=config.poll_interval_s,
        timeout_s=config.rollout_timeout_s,
    )
    answers = await read_answers(config.gateway, config.key, run_id)
    async with (
        GatewayCallLog(config.gateway, config.key, run_id) as calls,
        ModelProposer(config.optimizer, log=calls, answers=answers) as proposer,
    ):
        result = await run_search(
            config.search, seed_template, train, val, evaluator, proposer, store, progress
        )
    start_val = _val_mean(result, start_version)
    improved = result.winner.version != start_version and (start_val is None or result.winner_val > start_val)
    labelled = await _label_candidate(client, config, result, run_id) if improved else None
    release = await _release(client, config, result, run_id, val, improved, start_version, release_blocked)
    summary: dict[str, Any] = {
        "run_id": run_id,
        "resource": config.resource,
        "start": {"selector": config.start, "version": start_version, "val_mean": start_val},
        "winner": {"version": result.winner.version, "val_mean": result.winner_val},
        "improved": improved,
        "algorithm": result.algorithm,
        "spent": result.spent,
        "budget": result.budget,
        "rollouts": {"created": evaluator.created, "reused": evaluator.reused},
        "optimizer": {
            "model": config.optimizer_model,
            "calls": proposer.usage.calls,
            "answered_from_record": proposer.usage.from_record,
            "prompt_tokens": proposer.usage.prompt_tokens,
            "completion_tokens": proposer.usage.completion_tokens,
        },
        "candidate_label": labelled,
        "release": release,
        "run_dir": str(run_dir),
    }
    _write(run_dir, result, summary)
    return summary


def _val_mean(result: SearchResult, version: int) -> float | None:
    for scored in result.candidates:
        if scored.candidate.version == version:
            return scored.mean("val")
    return None


async def _label_candidate(
    client: httpx.AsyncClient, config: OptimizeConfig, result: SearchResult, run_id: str
) -> dict[str, Any] | None:
    if not config.candidate_label:
        return None
    path = f"/api/resources/{path_segment(config.resource)}/labels/{path_segment(config.candidate_label)}"
    body = {"version": result.winner.version, "reason": f"winner of optimize run {run_id}"}
    try:
        response = await client.put(path, json=body)
    except httpx.HTTPError as exc:
        return {"label": config.candidate_label, "error": f"gateway unreachable: {exc!r}"}
    if response.status_code not in (200, 201):
        log.error("could not label the winner", label=config.candidate_label, status=response.status_code)
        return {"label": config.candidate_label, "error": f"HTTP {response.status_code}: {detail(response)}"}
    return {"label": config.candidate_label, "version": result.winner.version}


async def _release(
    client: httpx.AsyncClient,
    config: OptimizeConfig,
    result: SearchResult,
    run_id: str,
    val: list[Instance],
    improved: bool,
    start_version: int,
    blocked: str | None = None,
) -> dict[str, Any] | None:
    plan = config.release
    if plan is None:
        return None
    outcome = {"resource": config.resource, "label": config.release_label, "candidate": result.winner.version}
    if not improved:
        return skipped(outcome, f"the winner does not beat the start (version {start_version}) on validation")
    if blocked is not None:
        return skipped(outcome, blocked)
    if not plan.replay_items:  # the held-out instances are the replay gate's stored tasks
        items = [{"input": instance.input, **_config_item(config)} for instance in val]
        replay = plan.plan.replay or ReplayPlan(pairs=len(items))
        plan = StartPlan(plan.plan.model_copy(update={"replay": replay}), items)
    return await start_release_once(
        client,
        release_id=release_id_of(run_id, result.winner.version),
        resource=config.resource,
        label=config.release_label,
        candidate=result.winner.version,
        plan=plan,
    )


def _config_item(config: OptimizeConfig) -> dict[str, Any]:
    rollout_config = config.rollout_config_json()
    return {"config": rollout_config} if rollout_config is not None else {}


def _write(run_dir: Path, result: SearchResult, summary: dict[str, Any]) -> None:
    data = result.to_json()
    with (run_dir / "candidates.jsonl").open("w", encoding="utf-8") as out:
        for candidate in data["candidates"]:
            out.write(json.dumps(candidate) + "\n")
    summary["score_png"] = _plot(run_dir / "score.png", result)
    summary["curve"] = data["curve"]
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _plot(path: Path, result: SearchResult) -> str | None:
    """Best validation score against evaluations spent; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    spent = [point[0] for point in result.curve]
    best = [point[1] for point in result.curve]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    # With markers: a search that found nothing better has a curve of one point.
    axes.step(spent, best, where="post", marker="o")
    axes.set_xlabel("evaluations (rollouts) spent")
    axes.set_ylabel("best validation mean")
    axes.set_title(f"keraunos optimize: {result.algorithm}")
    axes.set_ylim(-0.02, 1.02)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def progress_printer(say: Callable[[str], None]) -> Progress:
    """A `Progress` that prints a line when the best score moves (for runs without a terminal bar)."""
    last: list[float | None] = [None]

    def report(spent: int, best: float | None) -> None:
        if best is not None and best != last[0]:
            last[0] = best
            say(f"  {spent} evaluations: best validation mean {best:.3f}")

    return report

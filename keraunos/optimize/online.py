"""`keraunos optimize` online: one search per window of production data, its winner through a release.

Window k of a run is `[T0 + k*W, T0 + (k+1)*W)` in gateway creation time, T0 the moment the run
first started (kept in `RUN_DIR/online.json`, so a restarted run keeps its windows) and W
`online_window_s`. For each window, once it has ended:

1. **Data.** The rollouts created in the window that asked for `resource` at `start` (the label,
   normally `production`), read with `GET /api/resources/{name}/rollouts` and each rollout's
   `GET /api/rollouts/{id}` and `.../resources`: not the optimiser's own evaluations (`apo:` ids,
   `metadata.optimize`), not a release's rollouts (`release_id`). Their inputs are the instances,
   their rollout ids the instance ids, the last `val_size` validate. Fewer than
   `online_min_rollouts`: the window is skipped.
2. **The label is free.** While a release holds `release_label` (the previous window's, or anyone's),
   the window waits for it to end, at most W seconds; after that its winner is stored and labelled
   but its release is skipped, and the window's record says why.
3. **Search and release** (`search_and_release`, as a one-shot run) as run `RUN_ID-wK`, in
   `RUN_DIR/wK/`, from the template `start` names at that moment; its winner, when better, goes
   through `start_release_once` (release `RUN_ID-wK.release.vN`).
4. **Record.** One line per window in `RUN_DIR/windows.jsonl`. Steps 1 and 2's results are kept in
   `RUN_DIR/wK/window.json` before the search, so a run killed during a window's search resumes the
   same data, the same release decision, and (through the run id) the evaluations already paid.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import structlog

from keraunos.controller._urls import path_segment
from keraunos.errors import InputError
from keraunos.optimize.config import OptimizeConfig
from keraunos.optimize.gateway import OptimizeGatewayError
from keraunos.optimize.run import gateway_client, run_id_of, search_and_release
from keraunos.optimize.types import Instance
from keraunos.release.plan import Release

log = structlog.get_logger("keraunos.optimize")

#: Rollouts one page of the window's listing reads.
LISTING_PAGE = 1000
#: Rollouts read at once (their input and resources), so a large window does not flood the gateway.
READ_CONCURRENCY = 8
#: Seconds waited past a window's end before reading it: a rollout created at its very end has
#: committed by then.
SETTLE_S = 0.5


class OnlineStateError(InputError):
    """`RUN_DIR/online.json` belongs to another run or window length (the message says which)."""


async def optimize_online(
    config: OptimizeConfig, say: Callable[[str], None], stop: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """Run `config`'s windows until `online_windows` are recorded or `stop` is set (checked between
    windows and while waiting); the records of the windows this call ran (also appended to
    RUN_DIR/windows.jsonl). A window interrupted before its record is run again on restart."""
    stop = stop or asyncio.Event()
    run_id, run_dir, started_at, window = _open_run(config)
    records: list[dict[str, Any]] = []
    async with gateway_client(config) as client:
        while not stop.is_set() and (config.online_windows == 0 or window < config.online_windows):
            since = started_at + window * config.online_window_s
            until = since + config.online_window_s
            if not await _sleep_until(until + SETTLE_S, stop):
                break
            record = await _run_window(client, config, run_id, run_dir, window, since, until, say, stop)
            if record is None:  # stopped while waiting for the label
                break
            _append(run_dir / "windows.jsonl", record)
            say(window_line(record))
            records.append(record)
            window += 1
    return records


async def _run_window(
    client: httpx.AsyncClient,
    config: OptimizeConfig,
    run_id: str,
    run_dir: Path,
    window: int,
    since: float,
    until: float,
    say: Callable[[str], None],
    stop: asyncio.Event,
) -> dict[str, Any] | None:
    """One window's steps 1 to 3: its record, or None when `stop` came while it waited."""
    window_dir = run_dir / f"w{window}"
    window_run = f"{run_id}-w{window}"
    record: dict[str, Any] = {"window": window, "since": since, "until": until, "run_id": window_run}
    plan = _read_plan(window_dir)
    if plan is not None:  # a restart: the same data and release decision as before the kill
        instances = await _read_instances(client, config, plan["data"])
    else:
        instances = await window_data(client, config, since, until)
        plan = {"data": [i.id for i in instances], "release_wait": None}
        if len(instances) >= config.online_min_rollouts:
            plan["release_wait"] = await _wait_for_label(client, config, window, say, stop)
            if plan["release_wait"] is not None and plan["release_wait"].get("stopped"):
                return None
            _write_plan(window_dir, plan)
    record["rollouts"] = len(instances)
    if len(instances) < config.online_min_rollouts:
        why = f"{len(instances)} production rollouts, fewer than online_min_rollouts {config.online_min_rollouts}"
        log.warning("window skipped", window=window, why=why)
        return {**record, "skipped": why}
    wait = plan["release_wait"]
    record["release_wait"] = wait
    train, val = instances[: -config.val_size], instances[-config.val_size :]
    log.info("window search", window=window, run_id=window_run, train=len(train), val=len(val))
    summary = await search_and_release(
        client,
        config,
        window_run,
        window_dir,
        train,
        val,
        release_blocked=wait.get("blocked") if wait else None,
    )
    summary.pop("curve", None)
    return {**record, "train": len(train), "val": len(val), "summary": summary}


async def window_data(
    client: httpx.AsyncClient, config: OptimizeConfig, since: float, until: float
) -> list[Instance]:
    """The window's production instances, in creation order: the rollouts created in
    `[since, until)` that asked for `config.resource` at `config.start`, neither an evaluation
    of an optimiser nor a release's rollout; each rollout's input, its id the instance id."""
    ids: list[str] = []
    after = 0
    resource = path_segment(config.resource)
    while True:
        page = await _get(
            client,
            f"/api/resources/{resource}/rollouts",
            params={"since": since, "until": until, "after": after, "limit": LISTING_PAGE},
        )
        ids += [i["rollout_id"] for i in page["items"] if i["release_id"] is None and not _evaluation_id(i)]
        if len(page["items"]) < LISTING_PAGE:
            break
        after = page["next_after"]
    return await _read_instances(client, config, ids, check_selector=True)


def _evaluation_id(item: dict[str, Any]) -> bool:
    return str(item["rollout_id"]).startswith("apo:")


async def _read_instances(
    client: httpx.AsyncClient, config: OptimizeConfig, ids: list[str], *, check_selector: bool = False
) -> list[Instance]:
    """The instances of rollouts `ids` (those still there), in that order; with `check_selector`
    only those that asked for `config.start` and are not an optimiser's evaluation."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def read(rollout_id: str) -> Instance | None:
        async with limit:
            path = f"/api/rollouts/{path_segment(rollout_id)}"
            found = await _get(client, path, missing_ok=True)
            if found is None:
                return None
            rollout = found["rollout"]
            if check_selector:
                if (rollout.get("metadata") or {}).get("optimize") is not None:
                    return None
                assigned = await _get(client, f"{path}/resources", missing_ok=True) or {}
                entry = assigned.get(config.resource)
                if entry is None or str(entry.get("selector")) != config.start:
                    return None
            return Instance(id=rollout_id, input=rollout.get("input"))

    read_back = await asyncio.gather(*(read(rollout_id) for rollout_id in ids))
    return [instance for instance in read_back if instance is not None]


async def _wait_for_label(
    client: httpx.AsyncClient,
    config: OptimizeConfig,
    window: int,
    say: Callable[[str], None],
    stop: asyncio.Event,
) -> dict[str, Any] | None:
    """None when no release holds `release_label`; else how the wait for it ended: `{release_id,
    state, waited_s}`, plus `blocked` (why this window's release is skipped) when it still ran
    after `online_window_s`, or `stopped` when `stop` came first."""
    if not config.release_label:
        return None
    live = await _live_release(client, config)
    if live is None:
        return None
    bound = config.online_window_s
    say(
        f"window {window}: waiting for release {live.release_id} ({live.state} on "
        f"{live.label}) to end, at most {bound:g}s"
    )
    began = time.monotonic()
    while True:
        release = Release.model_validate(await _get(client, f"/api/releases/{path_segment(live.release_id)}"))
        state = release.state
        waited = round(time.monotonic() - began, 3)
        outcome: dict[str, Any] = {"release_id": live.release_id, "state": state, "waited_s": waited}
        if release.final:
            log.info("the label is free", window=window, release_id=live.release_id, state=state)
            return outcome
        if waited >= bound:
            why = (
                f"release {live.release_id} still {state} on {config.release_label} after "
                f"{bound:g}s (online_window_s): this window's winner is not released"
            )
            log.warning("window release skipped", window=window, why=why)
            return {**outcome, "blocked": why}
        if await _stopped_within(stop, min(config.poll_interval_s, bound - waited)):
            return {**outcome, "stopped": True}


async def _live_release(client: httpx.AsyncClient, config: OptimizeConfig) -> Release | None:
    listed = await _get(client, "/api/releases", params={"active": "true"})
    for item in listed:
        release = Release.model_validate(item)
        if (release.resource, release.label) == (config.resource, config.release_label) and not release.final:
            return release
    return None


async def _get(
    client: httpx.AsyncClient, path: str, *, params: dict[str, Any] | None = None, missing_ok: bool = False
) -> Any:
    try:
        response = await client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise OptimizeGatewayError(f"GET {path}: gateway unreachable: {exc!r}") from None
    if response.status_code == 404 and missing_ok:
        return None
    if response.status_code != 200:
        raise OptimizeGatewayError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
    return response.json()


def _open_run(config: OptimizeConfig) -> tuple[str, Path, float, int]:
    """The run's id, its directory (made), when it first started, and its next window."""
    run_id = run_id_of(config)
    run_dir = Path(config.run_dir or Path("runs") / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    started_at = _started_at(run_dir / "online.json", run_id, config.online_window_s)
    return run_id, run_dir, started_at, _next_window(run_dir / "windows.jsonl")


def _read_plan(window_dir: Path) -> dict[str, Any] | None:
    """A window's data and release decision, as recorded before its search (None: not yet)."""
    path = window_dir / "window.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _write_plan(window_dir: Path, plan: dict[str, Any]) -> None:
    window_dir.mkdir(parents=True, exist_ok=True)
    (window_dir / "window.json").write_text(json.dumps(plan) + "\n", encoding="utf-8")


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def _started_at(path: Path, run_id: str, window_s: float) -> float:
    """When the run first started: read from `path`, or now (written there) on its first start."""
    if path.exists():
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("run_id") != run_id or state.get("window_s") != window_s:
            raise OnlineStateError(
                f"{path} is of run {state.get('run_id')} with windows of {state.get('window_s')}s, not "
                f"of run {run_id} with {window_s}s: give another run_dir, or the run's own options"
            )
        return float(state["started_at"])
    started_at = time.time()
    path.write_text(json.dumps({"run_id": run_id, "started_at": started_at, "window_s": window_s}) + "\n")
    return started_at


def _next_window(path: Path) -> int:
    """The first window not recorded in windows.jsonl (windows run in order)."""
    if not path.exists():
        return 0
    recorded = [
        json.loads(line)["window"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return max(recorded) + 1 if recorded else 0


async def _sleep_until(moment: float, stop: asyncio.Event) -> bool:
    """Wait until the wall clock reads `moment`; False when `stop` came first."""
    return not await _stopped_within(stop, moment - time.time())


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    if seconds > 0:
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()


def window_line(record: dict[str, Any]) -> str:
    """The line printed when a window is recorded."""
    head = f"window {record['window']} ({record['rollouts']} production rollouts)"
    if "skipped" in record:
        return f"{head}: skipped ({record['skipped']})"
    summary = record["summary"]
    start, winner = summary["start"], summary["winner"]
    text = (
        f"{head}: {summary['resource']} v{start['version']} {_fmt(start['val_mean'])} -> v{winner['version']} "
        f"{_fmt(winner['val_mean'])}, {summary['spent']} evaluations"
    )
    release = summary.get("release")
    if release is None:
        return text
    if "skipped" in release:
        return f"{text}; release: none ({release['skipped']})"
    if "error" in release:
        return f"{text}; release: not started ({release['error']})"
    return f"{text}; release {release['release_id']}: {release['state']}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


@contextmanager
def stop_on_signals(stop: asyncio.Event, say: Callable[[str], None]) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (the run ends after the current window); a second one acts as
    usual (Ctrl-C twice stops at once: a window's search resumes from the ledger anyway)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)

    def handle(number: int) -> None:
        stop.set()
        say(f"{signal.Signals(number).name}: stopping after the current window (again to stop now)")
        for each in signals:
            loop.remove_signal_handler(each)

    for each in signals:
        loop.add_signal_handler(each, handle, each)
    try:
        yield
    finally:
        for each in signals:
            loop.remove_signal_handler(each)

"""`keraunos demo` end to end, shrunk by its flags: a tiny recipe (a few warm-start steps) and two
RL steps, on the real stack (embedded gateway and controller running the calc agent, the model
server and trainer in the demo's process). The model is prepared into the cache first (in this
process, as the demo does it), so the demo run must reuse it and skip its preparation.

Learning itself is measured by the full demo (docs/demo.md: three seeds); here the files, the
accounting (every call through the gateway, at least two per rollout, no merge break) and the
cache are checked.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from keraunos.testing.processes import clean_env, keraunos_command

# About 35 s on a quiet 2-core machine; the limit leaves room for a loaded one.
pytestmark = pytest.mark.timeout(600)

SHRUNK = (
    "--sft-steps", "4",
    "--sft-examples", "48",
    "--steps", "2",
    "--group-size", "2",
    "--batch-size", "2",
    "--pool-size", "4",
    "--prepare-threads", "1",  # the thread count the fixture prepares with (part of the cache key)
    "--progress", "false",
)  # fmt: skip
SUMMARY_KEYS = {
    "steps",
    "seconds",
    "reward_first5",
    "reward_last5",
    "rollouts",
    "model_calls",
    "merge_breaks",
    "min_model_calls_per_rollout",
    "model_source",
    "reward_curve",
}


def run_demo(tmp_path: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Short replies and two turns keep the barely warm-started model's episodes quick.
    env = clean_env(
        {"KERAUNOS_CACHE_DIR": str(tmp_path / "cache"), "CALC_MAX_TOKENS": "8", "CALC_MAX_TURNS": "2"}
    )
    return subprocess.run(
        keraunos_command("demo", "--run-dir", str(run_dir), *SHRUNK, *args),
        capture_output=True,
        text=True,
        timeout=500,
        env=env,
        cwd=tmp_path,
        check=False,
    )


def digest(path: Path) -> str:
    """A file's SHA-256: model files are compared by digest, so a mismatch fails at once (pytest
    would diff megabytes of bytes inside an assert)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shrunk_entry(tmp_path: Path) -> Path:
    """Where the fixture's (one-thread) build of the shrunk recipe is cached."""
    from keraunos.demo.prepare import build_tag, entry_dir

    return entry_dir(tmp_path / "cache", shrunk_recipe(), build_tag(1))


def shrunk_recipe():
    """The recipe the demo derives from the `SHRUNK` flags."""
    from keraunos.demo.command import recipe_of
    from keraunos.demo.config import DemoConfig

    flags = dict(zip(SHRUNK[::2], SHRUNK[1::2], strict=True))
    return recipe_of(DemoConfig.load({k.removeprefix("--").replace("-", "_"): v for k, v in flags.items()}))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    """A cache holding the shrunk recipe's model, prepared twice: built, then found."""
    from keraunos.demo.prepare import prepare_model

    tmp_path = tmp_path_factory.mktemp("demo")
    built = prepare_model(shrunk_recipe(), tmp_path / "cache", torch_threads=1)
    found = prepare_model(shrunk_recipe(), tmp_path / "cache", torch_threads=1)
    return tmp_path, built, found


@pytest.fixture(scope="module")
def first(prepared: tuple[Path, object, object]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path, _, _ = prepared
    result = run_demo(tmp_path, tmp_path / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path, result


def test_the_demo_writes_metrics_per_step_a_summary_and_a_png_reward_curve(
    first: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp_path, result = first
    run_dir = tmp_path / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS and summary["steps"] == 2
    assert (run_dir / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary["reward_curve"] == str(run_dir / "reward.png")
    # The console summary says where everything is.
    for line in ("keraunos demo done:", f"metrics        {run_dir / 'metrics.jsonl'}", "reward curve"):
        assert line in result.stdout


def test_every_rollout_made_at_least_two_model_calls_through_the_gateway_without_a_merge_break(
    first: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp_path, _ = first
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rollouts"] == 2 * 2 * 2
    assert summary["min_model_calls_per_rollout"] >= 2
    assert summary["model_calls"] == 2 * summary["rollouts"]  # CALC_MAX_TURNS=2
    assert summary["merge_breaks"] == 0
    # The calls counted are the gateway's records (the trainer reads them from its ledger).
    assert (tmp_path / "run" / "ledger.db").is_file()


def test_the_model_is_prepared_once_into_the_cache_and_then_found_there(
    prepared: tuple[Path, object, object],
) -> None:
    from keraunos.demo.prepare import Prepared

    tmp_path, built, found = prepared
    assert isinstance(built, Prepared) and isinstance(found, Prepared)
    assert built.built and not found.built and found.path == built.path
    assert built.path == shrunk_entry(tmp_path)
    assert (built.path / "config.json").is_file() and (built.path / "tokenizer.json").is_file()
    assert [p.name for p in built.path.parent.iterdir()] == [built.path.name]  # no temporary build left


def test_the_prepared_model_is_the_same_bytes_for_the_same_recipe_and_thread_count(tmp_path: Path) -> None:
    """The cache promises one set of weights per recipe and build tag (thread count, CPU
    capability, torch version): two builds on two threads are byte for byte the same, and a
    build on one thread is another cache entry, since float reductions split by thread count need
    not agree (they do not on the project's machines)."""
    from keraunos.demo.prepare import prepare_model

    recipe = shrunk_recipe().model_copy(update={"sft_steps": 24})
    first = prepare_model(recipe, tmp_path / "a", torch_threads=2)
    again = prepare_model(recipe, tmp_path / "b", torch_threads=2)
    other = prepare_model(recipe, tmp_path / "a", torch_threads=1)
    assert first.built and again.built and other.built
    assert first.path.name == again.path.name != other.path.name
    assert first.path.name.split("-")[1] == "t2" and other.path.name.split("-")[1] == "t1"
    for name in ("model.safetensors", "tokenizer.json"):
        same = digest(first.path / name) == digest(again.path / name)
        assert same, f"{name} differs between two builds on two threads"
    # The tokenizer does not depend on threads at all: it is trained before any torch work.
    assert digest(first.path / "tokenizer.json") == digest(other.path / "tokenizer.json")


def test_the_demo_reuses_the_cached_model_and_skips_its_preparation(
    first: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp_path, result = first
    assert "model: reusing the cached prepared model (no preparation)" in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model_source"] == "cached"
    assert summary["model"] == str(shrunk_entry(tmp_path))


def test_a_run_directory_with_an_earlier_run_is_refused_in_one_line(
    first: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    tmp_path, _ = first
    result = run_demo(tmp_path, tmp_path / "run")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'run'} holds an earlier run; pick another --run-dir"
    ]


def test_a_model_directory_without_a_model_is_refused_in_one_line(tmp_path: Path) -> None:
    result = run_demo(tmp_path, tmp_path / "run", "--model", str(tmp_path / "nothing"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: --model {tmp_path / 'nothing'} holds no Hugging Face model (no config.json)"
    ]
    assert not (tmp_path / "run").exists()


def test_a_bad_setting_is_refused_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    result = run_demo(tmp_path, tmp_path / "run", "--group-size", "1")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "group_size" in result.stderr

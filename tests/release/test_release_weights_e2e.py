"""Issue 18 end to end: the demo's trained weights released against its base weights.

`keraunos demo` trains the tiny calc model for `STEPS` GRPO steps (its prepared base model is
cached under `$KERAUNOS_CACHE_DIR`, else `~/.cache/keraunos`, as the demo's own). Then, each as its own process on
127.0.0.1 (tests/release/calc_release_support.py): a gateway, two `keraunos serve` — the base model
registered at weights version 0, the final checkpoint at the version the run ended at —, a
controller running `CalcAgent` and the release runner. Both weights are pushed with `keraunos
resource push` as versions of the `weights` resource `policy`, `production` pointing at the base.

Every rollout asks for `{"policy": "production"}`; a release's canary split assigns it the base or
the trained version, and the proxy routes it only to the engine serving the version it was
assigned (docs/proxy.md, "Routing by weights version"). So the trained weights, whose reward rose
during training, are promoted; the base weights released back against them are rolled back by the
runner alone, their rollouts marked excluded; every recorded call of a rollout carries the
weights version of its arm; the audit log verifies.

Opt-in (`pytest -m slow tests/release/test_release_weights_e2e.py`): the demo's training takes
2 to 3 minutes (plus 2 to 4 to build the base model the first time), each release one to two.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from calc_release_support import (
    SERVED,
    Outcome,
    Stack,
    cache_dir,
    cli,
    production,
    release_and_drive,
    report,
    running_stack,
    skip_unless_opted_in,
)

from keraunos.testing.processes import clean_env, keraunos_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

#: GRPO steps of the demo run whose final checkpoint is the candidate.
STEPS = 15
POLICY = "policy"


@dataclass(frozen=True)
class Trained:
    base: Path
    checkpoint: Path
    version: int  # the weights version the run's engines served after its last update
    reward_first5: float
    reward_last5: float


@pytest.fixture(scope="module")
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    skip_unless_opted_in(request, "tests/release/test_release_weights_e2e.py")
    run_dir = tmp_path_factory.mktemp("weights-demo") / "run"
    done = subprocess.run(
        keraunos_command(
            "demo", "--steps", str(STEPS), "--run-dir", str(run_dir),
            "--cache-dir", str(cache_dir()), "--progress", "false",
        ),
        capture_output=True, text=True, timeout=1200, env=clean_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    base = Path(summary["model"])  # the prepared model the run started from
    checkpoint = run_dir / "checkpoints" / f"step-{summary['steps']}" / "model"
    assert (checkpoint / "config.json").is_file(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    print(
        f"\ndemo: reward {summary['reward_first5']:.3f} -> {summary['reward_last5']:.3f}, version {summary['version']}"
    )
    return Trained(
        base, checkpoint, int(summary["version"]), summary["reward_first5"], summary["reward_last5"]
    )


@pytest.fixture(scope="module")
def stack(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = [(trained.base, 0), (trained.checkpoint, trained.version)]
    with running_stack(tmp_path_factory.mktemp("release-weights"), models) as stack:
        yield stack


def push_weights(stack: Stack, location: Path, model_version: int, message: str) -> int:
    """`keraunos resource push policy --kind weights --file F`: the new version's number."""
    content = {"location": str(location), "model": SERVED, "model_version": model_version}
    path = stack.base / f"weights-{model_version}-{len(message)}.json"
    path.write_text(json.dumps(content))
    pushed = cli(
        stack, "resource", "push", POLICY, "--kind", "weights", "--file", str(path), "-m", message, "--json"
    )
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    answer = json.loads(pushed.stdout)
    assert answer["created"] is True, answer
    return int(answer["version"]["version"])


def served_versions(stack: Stack, outcome: Outcome, arm: str) -> set[int]:
    """The `model_version` of every recorded call of the release's rollouts of `arm`."""
    versions: set[int] = set()
    with stack.gateway.client() as api:
        for observation in outcome.observations:
            if observation["arm"] != arm:
                continue
            events = api.get(
                f"/api/rollouts/{observation['rollout_id']}/events", params={"event_type": "model_request"}
            ).json()
            versions.update(int(e["data"]["model_version"]) for e in events)
    return versions


def test_the_trained_weights_are_promoted_over_the_base_and_the_base_rolled_back_over_them(
    trained: Trained, stack: Stack
) -> None:
    assert trained.reward_last5 > trained.reward_first5  # the run learned: there is something to release
    base = push_weights(stack, trained.base, 0, "the warm-started base")
    candidate = push_weights(stack, trained.checkpoint, trained.version, f"after {STEPS} GRPO steps")
    labelled = cli(stack, "resource", "label", POLICY, "production", str(base), "--expected", "0")
    assert labelled.returncode == 0, labelled.stdout + labelled.stderr

    promoted = release_and_drive(stack, POLICY, "rel-weights-trained", candidate)
    report("trained vs base weights", promoted)
    assert promoted.release["state"] == "promoted", promoted.release
    with stack.gateway.client() as api:
        assert production(api, POLICY) == candidate
    # Each arm's calls reached only the engine serving its version.
    assert served_versions(stack, promoted, "candidate") == {trained.version}
    assert served_versions(stack, promoted, "baseline") == {0}

    # The base weights again, as a new version, against the trained ones now in production.
    again = push_weights(stack, trained.base, 0, "the base again")
    rolled = release_and_drive(stack, POLICY, "rel-weights-base", again)
    report("base vs trained weights", rolled)
    assert rolled.release["state"] == "rolled_back", rolled.release
    assert served_versions(stack, rolled, "candidate") == {0}
    with stack.gateway.client() as api:
        assert production(api, POLICY) == candidate
        for observation in rolled.observations:
            assigned = api.get(f"/api/rollouts/{observation['rollout_id']}/resources").json()[POLICY]
            excluded = observation["arm"] == "candidate"
            expected = (again if excluded else candidate, excluded)
            assert (assigned["version"]["version"], assigned["release"]["excluded"]) == expected, assigned

    verified = cli(stack, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr

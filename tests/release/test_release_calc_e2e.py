"""Issue 18 end to end: releases of the calc agent's system prompt, decided by what a real model did.

Every part runs as its own process on 127.0.0.1, as a user starts it
(tests/release/calc_release_support.py): `keraunos gateway` (SQLite), `keraunos serve` with the demo's warm-started tiny model (`keraunos.demo.prepare`, cached under
`$KERAUNOS_CACHE_DIR`, else `~/.cache/keraunos`: built once, 2 to 4 minutes on 2 cores, then found),
`keraunos controller` running `CalcAgent`, and the release runner `keraunos release run`. The
test plays the traffic: it keeps creating rollouts that ask for `{"system_prompt": "production"}`
(questions of the demo's kind) until the release is final, at most `ROLLOUT_CAP` of them.

The two prompts: the built-in `SYSTEM_PROMPT` (the one the model was warm-started with) and a
broken one that drops the calculator instructions. With the built-in prompt the model calls the
calculator and copies its result in 30 to 50 % of the rollouts; with the broken one it earns a
reward in 3 to 10 % (docs/release.md#end-to-end has the measured figures). So, with the default
superiority statistics: the good prompt released against the broken one in production is
promoted, and the broken one released against the good one is rolled back by the runner alone,
the label staying at the good version and the candidate's rollouts marked excluded. The audit
log verifies through the gateway, and `keraunos audit verify --db` names the entry edited in the
stopped gateway's file.

Opt-in (`pytest -m slow tests/release/test_release_calc_e2e.py`): about a minute once the model is
cached, but building it first takes 2 to 4 minutes, which the suite's time on 2 cores cannot take.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from calc_release_support import (
    Stack,
    cli,
    prepared_model,
    production,
    release_and_drive,
    report,
    running_stack,
    skip_unless_opted_in,
)

from keraunos.examples.calc.conversation import SYSTEM_PROMPT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: The system prompt without the calculator protocol (what issue 18 calls the broken candidate).
BROKEN = "Answer the question."
PROMPT = "system_prompt"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    skip_unless_opted_in(request, "tests/release/test_release_calc_e2e.py")
    with running_stack(tmp_path_factory.mktemp("release-calc"), [(prepared_model(), 0)]) as stack:
        yield stack


def push(stack: Stack, template: str) -> int:
    with stack.gateway.client() as api:
        pushed = api.post(
            f"/api/resources/{PROMPT}", json={"kind": "prompt", "content": {"template": template}}
        )
        assert pushed.status_code == 201, pushed.text
        return pushed.json()["version"]["version"]


def test_the_good_prompt_is_promoted_the_broken_one_rolled_back_and_the_audit_log_proves_it(
    stack: Stack,
) -> None:
    broken = push(stack, BROKEN)
    good = push(stack, SYSTEM_PROMPT)
    with stack.gateway.client() as api:
        assert (
            api.put("/api/resources/system_prompt/labels/production", json={"version": broken}).status_code
            == 200
        )

    # The good prompt against the broken one in production: promoted by the runner.
    promoted = release_and_drive(stack, PROMPT, "rel-e2e-good", good)
    report("good vs broken", promoted)
    assert promoted.release["state"] == "promoted", promoted.release
    with stack.gateway.client() as api:
        assert production(api, PROMPT) == good

    # The broken prompt again (a new version) against the good one, now production.
    again = push(stack, BROKEN + "\n")
    rolled = release_and_drive(stack, PROMPT, "rel-e2e-broken", again)
    report("broken vs good", rolled)
    assert rolled.release["state"] == "rolled_back", rolled.release
    with stack.gateway.client() as api:
        assert production(api, PROMPT) == good
        candidates = [o["rollout_id"] for o in rolled.observations if o["arm"] == "candidate"]
        baselines = [o["rollout_id"] for o in rolled.observations if o["arm"] == "baseline"]
        assert candidates and baselines
        for rollout_id in candidates + baselines:
            assigned = api.get(f"/api/rollouts/{rollout_id}/resources").json()["system_prompt"]
            expected = (again, True) if rollout_id in candidates else (good, False)
            assert (assigned["version"]["version"], assigned["release"]["excluded"]) == expected, assigned
        audit = api.get("/api/audit", params={"limit": 1000}).json()["items"]
    decided = [
        (e["action"], e["actor"]) for e in audit if e["action"] in ("release.promote", "release.rollback")
    ]
    assert decided == [("release.promote", "runner:e2e"), ("release.rollback", "runner:e2e")]

    verified = cli(stack, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"audit log ok: {len(audit)} entries, head sha256:")

    # Stop everything that writes, then edit the rollback's audit row in the file.
    for process in (stack.runner, stack.controller):
        process.stop()
    assert stack.gateway.stop() == 0
    rollback_seq = next(e["seq"] for e in audit if e["action"] == "release.rollback")
    with sqlite3.connect(stack.gateway.db) as conn:
        edit = "UPDATE audit_log SET reason = 'looked fine to me' WHERE seq = ?"
        assert conn.execute(edit, (rollback_seq,)).rowcount == 1
    conn.close()
    tampered = cli(stack, "audit", "verify", "--db", str(stack.gateway.db))
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert f"entry {rollback_seq}: its content does not match its hash (edited)" in tampered.stdout

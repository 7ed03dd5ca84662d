"""`POST /api/audit` (docs/protocol.md#audit): a client appends its own actions to the audit log,
in a client namespace only, with its key's name as the actor; the chain still verifies.

One real gateway process with scoped keys (reader, trainer) on loopback; `keraunos audit verify`
runs as an operator runs it.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(120)

KEYS = {"reader-1": ("reader", "audit-reader-secret-01"), "trainer-1": ("trainer", "audit-trainer-secret-01")}
CALL = {
    "action": "optimize.call",
    "subject": "optimize:run-1",
    "reason": "edit of optimize run run-1",
    "evidence": {
        "operator": "edit",
        "reply": "<prompt>Be brief: {question}</prompt>",
        "usage": {"prompt_tokens": 7},
    },
}


@pytest.fixture(scope="module")
def keyed(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    entries = [
        {"name": name, "role": role, "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, (role, key) in KEYS.items()
    ]
    keys_file = tmp_path_factory.mktemp("audit-keys") / "keys.yaml"
    keys_file.write_text(yaml.safe_dump({"keys": entries}), encoding="utf-8")
    return session_gateway_factory(args=("--keys-file", str(keys_file)))


def as_key(gateway: Gateway, name: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.base_url, headers={"Authorization": f"Bearer {KEYS[name][1]}"}, timeout=30
    )


def entries(gateway: Gateway) -> list[dict[str, Any]]:
    with gateway.client() as admin:
        items: list[dict[str, Any]] = []
        while True:
            page = admin.get("/api/audit", params={"after": len(items), "limit": 1000}).json()["items"]
            items.extend(page)
            if len(page) < 1000:
                return items


def test_a_trainer_appends_an_optimizer_call_and_the_entry_names_its_key_and_is_chained(
    keyed: Gateway,
) -> None:
    subject = f"optimize:{unique_id('run')}"
    with as_key(keyed, "trainer-1") as trainer:
        answer = trainer.post("/api/audit", json={**CALL, "subject": subject})
    assert answer.status_code == 201, answer.text
    entry = answer.json()
    assert (entry["actor"], entry["action"], entry["subject"]) == ("key:trainer-1", "optimize.call", subject)
    assert entry["evidence"] == CALL["evidence"] and entry["reason"] == CALL["reason"]
    stored = [e for e in entries(keyed) if e["seq"] == entry["seq"]]
    assert stored == [entry]


def test_subject_reason_and_evidence_may_be_left_out(keyed: Gateway) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        entry = trainer.post("/api/audit", json={"action": "client.note"}).json()
    assert (entry["subject"], entry["reason"], entry["evidence"]) == ("", "", None)


@pytest.mark.parametrize(
    "action",
    [
        "release.promote",
        "label.move",
        "resource.push",
        "optimize",
        "optimizer.call",
        "Optimize.call",
        "optimize.",
    ],
)
def test_an_action_outside_the_client_namespaces_is_422_and_appends_nothing(
    keyed: Gateway, action: str
) -> None:
    before = len(entries(keyed))
    with as_key(keyed, "trainer-1") as trainer:
        answer = trainer.post("/api/audit", json={**CALL, "action": action})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "action"]
    assert len(entries(keyed)) == before


def test_a_forged_release_promote_is_refused_even_with_the_server_key(keyed: Gateway) -> None:
    with keyed.client() as admin:
        answer = admin.post(
            "/api/audit", json={"action": "release.promote", "subject": "release:rel-1", "reason": "forged"}
        )
    assert answer.status_code == 422
    assert all(e["action"] != "release.promote" for e in entries(keyed))


def test_a_reader_key_is_403_and_an_agent_token_is_403(keyed: Gateway) -> None:
    before = len(entries(keyed))
    with as_key(keyed, "reader-1") as reader:
        refused = reader.post("/api/audit", json=CALL)
    assert refused.status_code == 403
    assert "reader-1" in refused.json()["detail"]
    rollout = unique_id("r")
    with keyed.client() as admin:
        assert admin.post("/api/rollouts", json=[{"rollout_id": rollout, "input": 1}]).status_code == 201
        token = admin.post(f"/api/rollouts/{rollout}/attempt/1/token").json()["token"]
    with httpx.Client(base_url=keyed.base_url, headers={"x-api-key": token}, timeout=30) as agent:
        assert agent.post("/api/audit", json=CALL).status_code == 403
    assert len(entries(keyed)) == before


def test_evidence_over_256_kib_is_413_naming_the_limit(keyed: Gateway) -> None:
    big = {"reply": "x" * (256 * 1024)}
    with as_key(keyed, "trainer-1") as trainer:
        answer = trainer.post("/api/audit", json={**CALL, "evidence": big})
    assert answer.status_code == 413
    assert "262144" in answer.json()["detail"] and "evidence" in answer.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"action": "optimize.call", "extra": 1},
        {"action": "optimize.call", "evidence": [1, 2]},
        {"action": "optimize.call", "subject": "s" * 257},
        {"subject": "optimize:run-1"},
    ],
    ids=["unknown field", "evidence not an object", "subject too long", "no action"],
)
def test_a_body_that_does_not_validate_is_422(keyed: Gateway, body: dict[str, Any]) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        assert trainer.post("/api/audit", json=body).status_code == 422


def test_evidence_the_chain_could_not_hash_back_exactly_is_422(keyed: Gateway) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        for raw in (
            '{"action": "optimize.call", "evidence": {"x": NaN}}',
            '{"action": "optimize.call", "evidence": {"x": 123456789012345678901234}}',
        ):
            answer = trainer.post("/api/audit", content=raw, headers={"content-type": "application/json"})
            assert answer.status_code == 422, raw
            assert answer.json()["detail"][0]["loc"] == ["body", "evidence"]


def test_keraunos_audit_verify_passes_after_appended_entries(
    keyed: Gateway, cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        for n in range(3):
            assert (
                trainer.post("/api/audit", json={**CALL, "subject": f"optimize:verify-{n}"}).status_code
                == 201
            )
    verified = cli(
        "audit", "verify", env={"KERAUNOS_GATEWAY_URL": keyed.base_url, "KERAUNOS_GATEWAY_KEY": keyed.key}
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("audit log ok:")

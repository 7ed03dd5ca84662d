"""Scoped keys end to end (docs/protocol.md#scoped-keys): named keys with roles from --keys-file,
what each may do to resources and labels, what agent tokens may not, who the audit log names, and
the one-line refusal of a bad keys file. Real gateway processes on loopback."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from keraunos.testing.processes import Gateway, unique_id

pytestmark = pytest.mark.timeout(120)

KEYS = {
    "reader-1": ("reader", "reader-secret-0001"),
    "controller-1": ("controller", "controller-secret-0001"),
    "trainer-1": ("trainer", "trainer-secret-0001"),
    "approver-1": ("approver", "approver-secret-0001"),
    "admin-1": ("admin", "admin-secret-0001"),
}
PLAIN_KEY = "plain-trainer-secret-0001"  # listed as `key:` (plaintext) rather than key_sha256
PROMPT = {"kind": "prompt", "content": {"template": "Answer: {question}"}}
BETTER = {"kind": "prompt", "content": {"template": "Think, then answer: {question}"}}


def write_keys(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"keys": entries}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def keyed(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with the server key and one scoped key of each role (and one plaintext entry)."""
    entries: list[dict[str, Any]] = [
        {"name": name, "role": role, "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
        for name, (role, key) in KEYS.items()
    ]
    entries.append({"name": "plain-trainer", "role": "trainer", "key": PLAIN_KEY})
    keys_file = write_keys(tmp_path_factory.mktemp("keys") / "keys.yaml", entries)
    return session_gateway_factory(
        args=("--keys-file", str(keys_file), "--protected-labels", "production,stable")
    )


def as_key(gateway: Gateway, name: str) -> httpx.Client:
    key = PLAIN_KEY if name == "plain-trainer" else KEYS[name][1]
    return httpx.Client(base_url=gateway.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def as_token(gateway: Gateway, token: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.base_url, headers={"x-api-key": token}, timeout=30)


@pytest.fixture
def resource(keyed: Gateway) -> str:
    """A prompt resource with versions 1 and 2, `production` and `candidate` at 1."""
    name = unique_id("prompt")
    with keyed.client() as admin:
        assert admin.post(f"/api/resources/{name}", json=PROMPT).status_code == 201
        assert admin.post(f"/api/resources/{name}", json=BETTER).status_code == 201
        for label in ("production", "candidate"):
            assert admin.put(f"/api/resources/{name}/labels/{label}", json={"version": 1}).status_code == 200
    return name


def label_version(gateway: Gateway, name: str, label: str) -> int:
    with gateway.client() as admin:
        return admin.get(f"/api/resources/{name}/versions/{label}").json()["version"]


def audit_entries(gateway: Gateway, subject_part: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    with gateway.client() as admin:
        while True:
            items = admin.get("/api/audit", params={"after": len(entries), "limit": 1000}).json()["items"]
            if not items:
                return [e for e in entries if subject_part in e["subject"]]
            entries += items


# -- roles on resources and labels ----------------------------------------------------------------


def test_a_read_only_key_reads_resources_but_cannot_move_a_label_and_the_label_stays(
    keyed: Gateway, resource: str
) -> None:
    with as_key(keyed, "reader-1") as reader:
        assert reader.get(f"/api/resources/{resource}/versions").status_code == 200
        assert reader.get("/api/audit").status_code == 200
        refused = reader.put(f"/api/resources/{resource}/labels/candidate", json={"version": 2})
        assert refused.status_code == 403
        assert refused.json() == {
            "detail": f"key 'reader-1' (role reader) may not PUT /api/resources/{resource}/labels/candidate"
        }
        assert reader.post(f"/api/resources/{resource}", json={**BETTER, "message": "x"}).status_code == 403
    assert label_version(keyed, resource, "candidate") == 1


def test_a_trainer_cannot_move_a_protected_label_but_can_move_candidate_and_push(
    keyed: Gateway, resource: str
) -> None:
    with as_key(keyed, "trainer-1") as trainer:
        for protected in ("production", "stable"):
            refused = trainer.put(f"/api/resources/{resource}/labels/{protected}", json={"version": 2})
            assert refused.status_code == 403, protected
            assert "key 'trainer-1' (role trainer) may not PUT" in refused.json()["detail"]
        assert (
            trainer.put(f"/api/resources/{resource}/labels/candidate", json={"version": 2}).status_code == 200
        )
        pushed = trainer.post(
            f"/api/resources/{resource}", json={"kind": "prompt", "content": {"template": "v3"}}
        )
        assert pushed.status_code == 201
        assert pushed.json()["version"]["created_by"] == "key:trainer-1"
    assert label_version(keyed, resource, "production") == 1
    assert label_version(keyed, resource, "candidate") == 2


def test_an_approver_can_move_production_but_cannot_push(keyed: Gateway, resource: str) -> None:
    with as_key(keyed, "approver-1") as approver:
        moved = approver.put(
            f"/api/resources/{resource}/labels/production", json={"version": 2, "expected": 1}
        )
        assert moved.status_code == 200
        assert moved.json()["updated_by"] == "key:approver-1"
        assert approver.post(f"/api/resources/{resource}", json=BETTER).status_code == 403
        assert approver.post("/api/rollouts", json=[{"input": 1}]).status_code == 403
    assert label_version(keyed, resource, "production") == 2


def test_a_controller_runs_attempts_but_cannot_create_rollouts_or_change_resources(
    keyed: Gateway, resource: str
) -> None:
    with as_key(keyed, "controller-1") as controller:
        assert controller.post("/api/rollouts", json=[{"input": 1}]).status_code == 403
        assert controller.post(f"/api/resources/{resource}", json=BETTER).status_code == 403
        assert (
            controller.put(f"/api/resources/{resource}/labels/candidate", json={"version": 2}).status_code
            == 403
        )
        claim = controller.post("/api/rollouts/claim", json={"controller_id": "c1", "count": 0})
        assert claim.status_code == 200, claim.text


def test_an_admin_key_and_a_plaintext_key_are_accepted_as_their_roles(keyed: Gateway, resource: str) -> None:
    with as_key(keyed, "admin-1") as admin:
        moved = admin.put(f"/api/resources/{resource}/labels/production", json={"version": 2})
        assert moved.status_code == 200
        assert admin.delete("/api/rollouts/no-such-rollout").status_code == 204
    with as_key(keyed, "plain-trainer") as trainer:
        assert (
            trainer.put(f"/api/resources/{resource}/labels/candidate", json={"version": 2}).status_code == 200
        )
        assert (
            trainer.put(f"/api/resources/{resource}/labels/production", json={"version": 1}).status_code
            == 403
        )


def test_an_unknown_key_is_401_as_before(keyed: Gateway) -> None:
    response = httpx.get(f"{keyed.base_url}/api/resources", headers={"Authorization": "Bearer not-a-key"})
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}


def test_a_refusal_on_a_proxy_path_has_openais_error_shape(keyed: Gateway) -> None:
    with as_key(keyed, "reader-1") as reader:
        refused = reader.post("/proxy/pause", json={})
        assert refused.status_code == 403
        body = refused.json()
        assert body["detail"] == "key 'reader-1' (role reader) may not POST /proxy/pause"
        assert (body["error"]["type"], body["error"]["code"]) == ("permission_error", "not_permitted")
        assert reader.get("/proxy/state").status_code == 200


def test_every_push_and_move_is_in_the_audit_log_with_the_key_that_made_it(keyed: Gateway) -> None:
    name = unique_id("prompt")
    with as_key(keyed, "trainer-1") as trainer:
        trainer.post(f"/api/resources/{name}", json=PROMPT)
        trainer.put(f"/api/resources/{name}/labels/candidate", json={"version": 1, "reason": "new"})
    with as_key(keyed, "approver-1") as approver:
        approver.put(f"/api/resources/{name}/labels/production", json={"version": 1, "reason": "approved"})
    with keyed.client() as server:
        server.post(f"/api/resources/{name}", json=BETTER)
    entries = audit_entries(keyed, name)
    assert [(e["action"], e["actor"], e["reason"]) for e in entries] == [
        ("resource.push", "key:trainer-1", ""),
        ("label.move", "key:trainer-1", "new"),
        ("label.move", "key:approver-1", "approved"),
        ("resource.push", "server-key", ""),
    ]


# -- agent tokens ---------------------------------------------------------------------------------


def test_an_agent_token_reads_its_own_rollouts_resources_only_and_changes_nothing(
    keyed: Gateway, resource: str
) -> None:
    mine, other = unique_id("r"), unique_id("r")
    with keyed.client() as admin:
        items = [{"rollout_id": r, "input": 1, "resources": {resource: "candidate"}} for r in (mine, other)]
        assert admin.post("/api/rollouts", json=items).status_code == 201
        token = admin.post(f"/api/rollouts/{mine}/attempt/1/token").json()["token"]
    with as_token(keyed, token) as agent:
        own = agent.get(f"/api/rollouts/{mine}/resources")
        assert own.status_code == 200
        assert own.json()[resource]["version"]["version"] == 1
        assert agent.get(f"/api/rollouts/{other}/resources").status_code == 403
        assert agent.post(f"/api/resources/{resource}", json=BETTER).status_code == 403
        assert (
            agent.put(f"/api/resources/{resource}/labels/candidate", json={"version": 2}).status_code == 403
        )
        assert agent.get(f"/api/resources/{resource}/versions").status_code == 403
        assert agent.get("/api/audit").status_code == 403
    assert label_version(keyed, resource, "candidate") == 1


# -- configuration --------------------------------------------------------------------------------


def test_a_gateway_with_only_scoped_keys_and_a_token_secret_serves_them(
    gateway_factory: Callable[..., Gateway], tmp_path: Path
) -> None:
    keys_file = write_keys(
        tmp_path / "keys.yaml", [{"name": "ops", "role": "reader", "key": "ops-secret-0001"}]
    )
    only_keys = gateway_factory(
        key="", args=("--keys-file", str(keys_file), "--token-secret", "sign-tokens-here")
    )
    url = f"{only_keys.base_url}/api/resources"
    assert httpx.get(url, headers={"x-api-key": "ops-secret-0001"}).status_code == 200
    assert httpx.get(url).status_code == 401
    assert "AUTH DISABLED" not in only_keys.log()


def test_with_auth_off_every_call_is_allowed_and_recorded_as_anonymous(
    gateway_factory: Callable[..., Gateway],
) -> None:
    open_gateway = gateway_factory(key="")
    name = unique_id("prompt")
    pushed = httpx.post(f"{open_gateway.base_url}/api/resources/{name}", json=PROMPT)
    assert pushed.status_code == 201
    assert pushed.json()["version"]["created_by"] == "anonymous"


BAD_FILES = {
    "not-yaml": ("keys: [", "not valid YAML"),
    "no-keys": ("keys: []", "at least one entry"),
    "not-a-mapping": ("- name: a", "must hold a mapping"),
    "unknown-role": (
        yaml.safe_dump({"keys": [{"name": "a", "role": "root", "key": "k-0001"}]}),
        "entry 1 ('a')",
    ),
    "both-key-forms": (
        yaml.safe_dump({"keys": [{"name": "a", "role": "reader", "key": "k-0001", "key_sha256": "0" * 64}]}),
        "exactly one of key_sha256",
    ),
    "short-digest": (
        yaml.safe_dump({"keys": [{"name": "a", "role": "reader", "key_sha256": "abc"}]}),
        "key_sha256",
    ),
    "name-twice": (
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "a", "role": "reader", "key": "k-0001"},
                    {"name": "a", "role": "admin", "key": "k-0002"},
                ]
            }
        ),
        "used twice",
    ),
    "key-twice": (
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "a", "role": "reader", "key": "k-0001"},
                    {"name": "b", "role": "admin", "key": "k-0001"},
                ]
            }
        ),
        "the same key as 'a'",
    ),
    "the-server-key": (
        yaml.safe_dump({"keys": [{"name": "a", "role": "reader", "key": "server-k"}]}),
        "server key",
    ),
}


@pytest.mark.parametrize(("text", "says"), BAD_FILES.values(), ids=list(BAD_FILES))
def test_a_bad_keys_file_stops_the_gateway_with_one_line_before_it_opens_the_ledger(
    cli: Callable[..., Any], free_port: Callable[[], int], tmp_path: Path, text: str, says: str
) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(text, encoding="utf-8")
    db = tmp_path / "ledger.db"
    result = cli(
        "gateway",
        "--key",
        "server-k",
        "--keys-file",
        str(keys_file),
        "--db",
        str(db),
        "--port",
        str(free_port()),
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: keys file")
    assert says in line
    assert not db.exists()


def test_a_missing_keys_file_or_one_without_a_server_key_or_token_secret_is_refused(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    missing = cli(
        "gateway", "--key", "k", "--keys-file", str(tmp_path / "nope.yaml"), "--db", str(tmp_path / "l.db")
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("error: cannot read keys file")
    keys_file = write_keys(tmp_path / "keys.yaml", [{"name": "a", "role": "reader", "key": "k-0001"}])
    unsigned = cli("gateway", "--key", "", "--keys-file", str(keys_file), "--db", str(tmp_path / "l.db"))
    assert unsigned.returncode == 2
    assert "token_secret" in unsigned.stderr
    assert len(unsigned.stderr.strip().splitlines()) == 1

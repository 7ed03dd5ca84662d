"""`tokens: placeholder` (docs/lifecycle.md#redaction): a secret's token ids replaced by the
placeholder's, those response positions masked from training, with a real Hugging Face tokenizer.

The tokenizer is a small byte-level BPE trained here with `tokenizers` and saved as a tokenizer
directory (`tokenizer.json`), as a served model's would be; the scripted model server answers with
its ids, so the stored ids are decoded with the same tokenizer the gateway loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redaction_support import ScriptedModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from keraunos._settings import ConfigError
from keraunos._tokenizer_file import TokenizerFile
from keraunos.gateway.config import GatewayConfig
from keraunos.redaction import RedactionPolicy, compile_policy, load_policy, redact_model_request
from keraunos.redaction._tokens import replace_spans
from keraunos.testing.processes import SERVED_MODEL, Gateway, unique_id
from keraunos.training._data import CompletedRollout
from keraunos.training._read import read_events, read_events_json
from keraunos.training.trajectories import TrajectoryConfig, build_rows

RULES = [{"detector": d} for d in ("api_key", "email", "credit_card", "ipv4", "phone")]
POLICY = orjson.dumps({"tokens": "placeholder", "rules": RULES}).decode()
SECRETS = [
    "jane.doe@example.com",
    "sk-proj-0123456789abcdefABCDEF",
    "AKIAIOSFODNN7EXAMPLE",
    "4111 1111 1111 1111",
    "+1 415 555 0134",
    "192.168.17.201",
]


def train_tokenizer(directory: Path) -> Path:
    """A byte-level BPE of 500 ids with two chat markers, saved as a tokenizer directory."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["please check the order now, ok?", "the user asked the assistant", *SECRETS] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def render(messages: list[dict[str, Any]]) -> str:
    """The scripted model's chat template."""
    text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def codec(tokenizer_dir: Path) -> TokenizerFile:
    return TokenizerFile(tokenizer_dir, purpose="redaction tokenizer")


def _ids(codec: TokenizerFile, text: str) -> list[int]:
    return codec.encode(text)[0]


# -- the pure part ---------------------------------------------------------------------------------


def test_the_ids_covering_a_secret_become_the_placeholders_and_only_those_positions_are_listed(
    codec: TokenizerFile,
) -> None:
    policy = compile_policy(RedactionPolicy.model_validate({"tokens": "placeholder", "rules": RULES}), codec)
    reply = "ok, mail jane.doe@example.com now"
    prompt = render([{"role": "user", "content": "please check the order"}])
    data = {
        "request": {"messages": [{"role": "user", "content": "please check the order"}]},
        "response": {
            "prompt_token_ids": _ids(codec, prompt),
            "choices": [{"message": {"content": reply}, "token_ids": _ids(codec, reply), "logprobs": None}],
        },
    }
    out = redact_model_request(policy, data).value
    choice = out["response"]["choices"][0]
    assert codec.decode(choice["token_ids"]) == "ok, mail [REDACTED:email] now"
    assert out["response"]["prompt_token_ids"] == data["response"]["prompt_token_ids"], (
        "a clean prompt keeps its ids"
    )
    masked = out["redaction"]["masked"]
    assert "[REDACTED:email]" in codec.decode([choice["token_ids"][i] for i in masked])
    kept = [t for i, t in enumerate(choice["token_ids"]) if i not in set(masked)]
    assert "REDACTED" not in codec.decode(kept) and "ok, mail" in codec.decode(kept)
    assert "untrainable" not in out["redaction"]


def test_ids_the_tokenizer_would_not_make_cannot_be_mapped_and_the_call_becomes_untrainable(
    codec: TokenizerFile,
) -> None:
    policy = compile_policy(RedactionPolicy.model_validate({"tokens": "placeholder", "rules": RULES}), codec)
    reply = "mail jane.doe@example.com"
    spelled = [i for ch in reply for i in _ids(codec, ch)]  # one id per character: not canonical
    assert spelled != _ids(codec, reply)
    assert (
        replace_spans(codec, spelled, {"jane.doe@example.com": "[REDACTED:email]"}, lambda _: False) is None
    )
    data = {"request": {}, "response": {"choices": [{"message": {"content": reply}, "token_ids": spelled}]}}
    out = redact_model_request(policy, data).value
    assert out["redaction"]["untrainable"] is True and "token_ids" not in out["response"]["choices"][0]


def test_placeholder_needs_a_tokenizer_and_a_tokenizer_needs_placeholder(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    placeholder = tmp_path / "placeholder.yaml"
    placeholder.write_text(POLICY)
    untrainable = tmp_path / "untrainable.yaml"
    untrainable.write_text("rules: [{detector: email}]")
    assert load_policy(placeholder, tokenizer_dir).codec is not None
    with pytest.raises(ConfigError, match="needs the serving model's tokenizer"):
        load_policy(placeholder)
    with pytest.raises(ConfigError, match="only used by a policy with 'tokens: placeholder'"):
        load_policy(untrainable, tokenizer_dir)
    with pytest.raises(ConfigError, match="cannot load the redaction tokenizer"):
        load_policy(placeholder, tmp_path)


def test_the_gateway_refuses_a_redaction_tokenizer_without_a_redaction_policy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="redaction_tokenizer is used only with redaction_policy"):
        GatewayConfig(redaction_tokenizer=tmp_path)
    assert GatewayConfig(
        redaction_tokenizer=tmp_path, redaction_policy=tmp_path / "p.yaml"
    ).redaction_tokenizer


def test_the_trainer_masks_the_placeholder_positions_and_trains_the_rest_of_the_call() -> None:
    events = [
        {
            "event_type": "model_request",
            "data": {
                "prompt_token_ids": [1, 2, 3],
                "response_token_ids": [4, 5, 6, 7],
                "response_log_probs": [-0.1, 0.0, 0.0, -0.2],
                "redaction": {"masked": [1, 2], "findings": []},
            },
        },
        {"event_type": "reward", "data": {"value": 1.0}},
    ]
    read = read_events(events)
    (triplet,) = read.triplets
    rows = build_rows(
        [CompletedRollout("r", "g", read.triplets, 1.0)],
        TrajectoryConfig(max_prompt_len=4, max_response_len=6),
    )
    assert rows.rows.response_mask[0].tolist() == [1, 0, 0, 1, 0, 0]
    assert triplet.untrained is not None and triplet.untrained.tolist() == [1, 2]


def test_a_mask_on_a_call_with_other_samples_or_outside_the_response_trains_nothing_of_it() -> None:
    def call(masked: Any, **extra: Any) -> dict[str, Any]:
        data = {
            "prompt_token_ids": [1, 2],
            "response_token_ids": [3, 4],
            "redaction": {"masked": masked},
            **extra,
        }
        return {"event_type": "model_request", "data": data}

    choices = [{"response_token_ids": [3, 4]}, {"response_token_ids": [5, 6]}]
    for event in (call([0], choices=choices), call([7]), call("x")):
        read = read_events([event])
        assert (read.triplets, read.redacted_calls) == ([], 1)


# -- end to end ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripted(codec: TokenizerFile) -> Iterator[ScriptedModel]:
    server = ScriptedModel(lambda messages: _ids(codec, render(messages)), lambda text: _ids(codec, text))
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def placeholder_gateway(
    session_gateway_factory: Any,
    scripted: ScriptedModel,
    tokenizer_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Gateway:
    policy = tmp_path_factory.mktemp("placeholder") / "policy.json"
    policy.write_text(POLICY)
    gateway = session_gateway_factory(
        args=(
            "--served-model",
            SERVED_MODEL,
            "--redaction-policy",
            str(policy),
            "--redaction-tokenizer",
            str(tokenizer_dir),
        )
    )
    with gateway.client() as api:
        assert (
            api.post("/api/models", json=[{"model": SERVED_MODEL, "endpoint": scripted.endpoint}]).status_code
            == 201
        )
    return gateway


def _chat(gateway: Gateway, rollout_id: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "agent", "messages": messages, "max_tokens": 8}
    response = httpx.post(
        gateway.proxy_base(rollout_id) + "/chat/completions", json=body, headers=gateway.headers, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


@settings(max_examples=6, derandomize=True, deadline=None)
@given(secret=st.sampled_from(SECRETS), where=st.sampled_from(["reply", "user"]))
def test_property_with_placeholders_no_stored_ids_decode_to_a_secret_and_no_trained_position_is_a_placeholder(
    placeholder_gateway: Gateway, scripted: ScriptedModel, codec: TokenizerFile, secret: str, where: str
) -> None:
    gateway = placeholder_gateway
    scripted.replies[:] = [
        "the order is ok",
        f"ok, use {secret} now" if where == "reply" else "ok",
        "check now",
    ]
    with gateway.client() as api:
        rollout_id = unique_id("ph")
        assert api.post("/api/rollouts", json=[{"input": {}, "rollout_id": rollout_id}]).status_code == 201
        history: list[dict[str, Any]] = [{"role": "user", "content": "please check the order"}]
        for turn in range(3):
            history.append({"role": "assistant", "content": _chat(gateway, rollout_id, history)})
            history.append(
                {
                    "role": "user",
                    "content": f"the user {secret} asked" if where == "user" and turn == 0 else "ok?",
                }
            )
        events = api.get(f"/api/rollouts/{rollout_id}/events").json()
        raw_triplets = api.get(f"/api/rollouts/{rollout_id}/events", params={"format": "triplet"}).content
        stored = [api.get(f"/api/rollouts/{rollout_id}/events").text, raw_triplets.decode(), gateway.log()]
    db = Path(gateway.db)
    stored += [p.read_bytes().decode("latin-1") for p in (db, db.with_name(db.name + "-wal")) if p.exists()]
    assert all(secret not in text for text in stored)
    calls = [e["data"] for e in events if e["event_type"] == "model_request"]
    for call in calls:  # every stored id sequence, decoded with the tokenizer, holds no secret
        response = call["response"]
        for ids in [response["prompt_token_ids"], *(c["token_ids"] for c in response["choices"])]:
            assert secret not in codec.decode(ids)
        for choice in response["choices"]:
            assert all(
                not entry["top_logprobs"] for entry in (choice["logprobs"] or {}).get("content", [])
            ) or ("redaction" not in call)
    redacted = [c for c in calls if "redaction" in c]
    assert redacted and all("untrainable" not in c["redaction"] for c in redacted), "the ids could be mapped"
    read = read_events_json(raw_triplets)
    assert len(read.triplets) == 3, "placeholders keep every call trainable"
    rows = build_rows([CompletedRollout(rollout_id, "g", read.triplets, 1.0)], TrajectoryConfig()).rows
    assert len(rows) >= 1
    for row in range(len(rows)):
        trained = rows.input_ids[row, rows.prompt_len :][rows.response_mask[row].astype(bool)]
        text = codec.decode(trained.tolist())
        assert secret not in text and "REDACTED" not in text, "a trained position inside a redacted span"
        assert np.any(rows.response_mask[row])

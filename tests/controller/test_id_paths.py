"""Ids never become paths or URL segments as they are: any id stays one file name inside its
directory, and one URL segment that names its own rollout."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

import httpx
from hypothesis import example, given, settings
from hypothesis import strategies as st

from keraunos.controller._urls import path_segment
from keraunos.controller.runners._paths import attempt_log_path, path_component, record_stem
from keraunos.controller.runners._state import AgentRecord, StateDir
from keraunos.controller.runners.local import LocalRunner

#: Ids a v1.0 server accepts: any string; the ones a hostile user tries first among them.
HOSTILE = [
    "..",
    ".",
    "/abs",
    "/",
    "a/b",
    "../../etc/passwd",
    "a\0b",
    "x" * 10_000,
    ".hidden",
    "é" * 200,
    "a@b",
    "~",
]
any_id = st.one_of(
    st.sampled_from(HOSTILE), st.text(min_size=1, max_size=300), st.text(alphabet="./\0", min_size=1)
)


@given(any_id, any_id)
@example("..", "1")
@example("/abs", "../1")
@settings(max_examples=200, deadline=None)
def test_an_attempt_log_of_any_ids_stays_inside_the_log_dir_in_names_the_file_system_takes(
    rollout_id: str, attempt_id: str
) -> None:
    log_dir = Path("/var/log/keraunos")
    path = attempt_log_path(log_dir, rollout_id, attempt_id)
    assert path.parent.parent == log_dir  # exactly two components below it, neither a `..`
    for part in path.relative_to(log_dir).parts:
        assert part not in (".", "..") and "/" not in part and "\0" not in part
        assert len(part.encode()) <= 255
    assert os.path.normpath(path) == str(path)
    assert "@" not in path_component(rollout_id)  # the state record joins the two with it


@given(any_id, any_id)
@settings(max_examples=100, deadline=None)
def test_two_different_ids_never_share_a_file_name(first: str, second: str) -> None:
    if first != second:
        assert path_component(first) != path_component(second)


def test_plain_ids_keep_their_readable_names_and_others_keep_a_readable_prefix() -> None:
    assert path_component("ro-1234abcd") == "ro-1234abcd"
    assert path_component("r_1.2") == "r_1.2"
    assert path_component("..").startswith("+") and len(path_component("..")) == 17
    assert path_component("../etc/passwd").startswith("_etc_passwd+")
    assert path_component("r:1").startswith("r_1+")
    assert len(path_component("x" * 10_000)) == 96


def test_a_local_runner_and_its_state_directory_write_hostile_ids_inside_their_directories(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path / "state")
    state.acquire()
    runner = LocalRunner(state, tmp_path / "logs", grace_s=0.1)
    for rollout_id in HOSTILE:
        path = runner.log_path(rollout_id, "../1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")  # a 10 kB id raised OSError (name too long) before
        record = AgentRecord(rollout_id, "../1", str(path), 1.0)
        state.write(record)
        assert (tmp_path / "state" / f"{record_stem(rollout_id, '../1')}.json").exists()
    assert sorted(record.rollout_id for record in state.records()) == sorted(HOSTILE)
    assert set(tmp_path.iterdir()) == {tmp_path / "logs", tmp_path / "state"}  # nothing written beside them
    assert len(list((tmp_path / "logs").iterdir())) == len(HOSTILE)  # one directory per rollout
    state.release()


@given(any_id)
@example("..")
@example(".")
@example("a/b")
@settings(max_examples=200, deadline=None)
def test_any_id_is_one_url_segment_that_no_client_normalises_and_that_decodes_back(value: str) -> None:
    segment = path_segment(value)
    url = httpx.URL(f"http://gateway/api/rollouts/{segment}/attempt/1/heartbeat")
    parts = url.raw_path.decode().split("/")
    assert parts[:3] == ["", "api", "rollouts"] and parts[4:] == ["attempt", "1", "heartbeat"]
    assert unquote(parts[3], errors="surrogatepass") == value
    assert "$" not in segment  # a `$(` in an id reaches no URL Kubernetes would expand

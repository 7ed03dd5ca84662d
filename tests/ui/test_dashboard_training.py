"""A training curve on the dashboard grows while a real `keraunos train` runs (docs/dashboard.md):
the run reports each step to its embedded gateway, whose dashboard polls and redraws, in Debian's
Chromium. The agent is the training tests' digits agent (tests/training_loop/agents), the model a
tiny one built on the spot."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from keraunos.testing.processes import clean_env, keraunos_command, wait_for

AGENTS = Path(__file__).resolve().parents[1] / "training_loop" / "agents"
KEY = "ui-live-train-key-0123456789"
STEPS = 6


def test_the_reward_curve_grows_while_keraunos_train_runs(browser: Any, tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"number {i}"}) + "\n" for i in range(8)))
    run_dir = tmp_path / "run"
    config = {
        "dataset": str(dataset),
        "agent_class": "digits_agent:DigitsAgent",
        "warm_workers": 2,
        "pool_size": 8,
        "model": str(tmp_path / "tiny"),
        "tiny": True,
        "gateway": "embedded",
        "key": KEY,
        "run_dir": str(run_dir),
        "run_id": "ui-live",
        "steps": STEPS,
        "group_size": 4,
        "batch_size": 2,
        "lr": 0.1,
        "max_prompt_len": 128,
        "max_response_len": 64,
        "poll_interval_s": 0.1,
        "controller_poll_interval_s": 0.1,
        "torch_threads": 1,
        "progress": False,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    pythonpath = os.pathsep.join(p for p in (str(AGENTS), os.environ.get("PYTHONPATH", "")) if p)
    with (tmp_path / "train.log").open("wb") as log:
        train = subprocess.Popen(
            keraunos_command("train", "--config", str(tmp_path / "train.yaml")),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=clean_env({"PYTHONPATH": pythonpath, "DIGITS_MAX_TOKENS": "8"}),
            cwd=tmp_path,
        )
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        run_json = run_dir / "run.json"
        wait_for(
            lambda: run_json.exists() and json.loads(run_json.read_text()).get("gateway"), 120, "run.json"
        )
        gateway = json.loads(run_json.read_text())["gateway"]
        page = context.new_page()
        page.goto(f"{gateway}/ui")
        page.fill("#key", KEY)
        page.click("button[type=submit]")
        page.wait_for_selector("#rollouts-table")
        page.goto(f"{gateway}/ui#/run/ui-live")
        figure = page.locator('figure[data-metric="reward_mean"]')
        seen: list[int] = []  # the points drawn, each time the count changed while the run went on
        deadline = time.monotonic() + 170
        while train.poll() is None and time.monotonic() < deadline:
            points = int(figure.get_attribute("data-points") or 0)
            if not seen or points != seen[-1]:
                seen.append(points)
            if points >= 2 and len(seen) >= 3:
                break
            time.sleep(0.2)
        # The curve grew point by point while the run was still training.
        assert len([p for p in seen if p > 0]) >= 2, (seen, (tmp_path / "train.log").read_text()[-2000:])
        assert seen == sorted(seen)
    finally:
        context.close()
        try:
            train.wait(timeout=170)
        finally:
            if train.poll() is None:
                train.terminate()
                train.wait(timeout=30)
    assert train.returncode == 0, (tmp_path / "train.log").read_text()[-3000:]

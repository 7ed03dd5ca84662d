"""A rollout of the real calc agent on the dashboard (docs/dashboard.md): a real controller runs
`keraunos.examples.calc.agent:CalcAgent` on a rollout of a real gateway, the engine stand-in
answers from a script (a calculator call, then the answer), and Debian's Chromium shows the
rollout: its reward, its trained reply tokens and, between the two calls, the calculator's result
turn as observation tokens, merged into one row."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keraunos.testing.processes import (
    SERVED_MODEL,
    Engine,
    Gateway,
    clean_env,
    keraunos_command,
    start_engine,
    start_gateway,
)

SCRIPT = """
- when: {contains: "<result>"}
  reply: {text: "<answer>42</answer>"}
- when: {contains: "What is"}
  reply: {text: "<calc>6*7</calc>"}
"""


@pytest.fixture
def calc_run(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway with one finished rollout `calc-real` of the calc agent, served by the stand-in."""
    (tmp_path / "script.yaml").write_text(SCRIPT)
    engine: Engine = start_engine(tmp_path / "engine", ("--script", str(tmp_path / "script.yaml")))
    gateway = start_gateway(tmp_path / "gateway", args=("--served-model", SERVED_MODEL))
    controller = None
    try:
        gateway.register([engine])
        cmd = keraunos_command(
            "controller",
            "--gateway", gateway.base_url,
            "--key", gateway.key,
            "--agent-class", "keraunos.examples.calc.agent:CalcAgent",
            "--poll-interval-s", "0.1",
            "--state-dir", str(tmp_path / "state"),
            "--log-dir", str(tmp_path / "logs"),
        )  # fmt: skip
        with (tmp_path / "controller.log").open("wb") as log:
            controller = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_env({"CALC_MAX_TURNS": "3"}),
                cwd=tmp_path,
            )
        item = {
            "rollout_id": "calc-real",
            "input": {"question": "What is 6 * 7?", "answer": 42},
            "metadata": {"data_id": "calc.real.i0"},
            "config": {"local": {"env_map": {"AGENT_INPUT": "input"}}},
        }
        with gateway.client() as api:
            assert api.post("/api/rollouts", json=[item]).status_code == 201
            deadline = time.monotonic() + 90
            while api.get("/api/rollouts/calc-real").json()["rollout"]["status"]["state"] not in (
                "succeeded",
                "failed",
            ):
                assert time.monotonic() < deadline, (tmp_path / "controller.log").read_text()[-2000:]
                time.sleep(0.2)
        yield gateway
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(15)
        gateway.stop()
        engine.kill()


def test_a_calc_agent_rollout_shows_its_reward_and_masked_tokens(browser: Any, calc_run: Gateway) -> None:
    with httpx.Client(base_url=calc_run.base_url, headers=calc_run.headers) as api:
        rewards = [
            e["data"]["value"]
            for e in api.get("/api/rollouts/calc-real/events").json()
            if e["event_type"] == "reward"
        ]
    assert rewards == [1.0]
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"{calc_run.base_url}/ui")
        page.fill("#key", calc_run.key)
        page.click("button[type=submit]")
        page.wait_for_selector("#rollouts-table tbody tr")
        page.goto(f"{calc_run.base_url}/ui#/rollout/calc-real")
        page.wait_for_selector("#call-1 .tok.trained")
        assert page.text_content("#rollout-reward") == "1.000"
        assert page.locator("#call-1 .merge-break").count() == 0  # the two calls merged into one row
        assert page.locator("#call-1 .tok.observation").count() > 0  # the <result> turn between them
        assert page.locator("#call-0 .tok.trained").count() > 0
        page.wait_for_selector("#messages-1 .msg")
        assert "<result>42</result>" in page.text_content("#messages-1")
        assert "<answer>42</answer>" in page.text_content("#messages-1")
    finally:
        context.close()

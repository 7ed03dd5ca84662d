"""Fixtures of the dashboard's tests: a real gateway with scoped keys, calc rollouts in its ledger,
and (for the browser tests) Debian's Chromium driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from calc_rollouts import calc_calls, post_rollout
from dashboard_keys import APPROVER_KEY, READER_KEY, TRAINER_KEY
from prerequisites import missing

from keraunos.testing.processes import Gateway

CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture(scope="module")
def ui_gateway(
    session_gateway_factory: Callable[..., Gateway], tmp_path_factory: pytest.TempPathFactory
) -> Gateway:
    """A gateway with a reader, a trainer and an approver key, holding three calc rollouts of one
    group (rewards 1, 0, 1; `calc-2` failed) made for step 0, one with a merge break (`calc-break`)
    made for step 1, and one validation rollout."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: reader-1, role: reader, key: {READER_KEY}}}\n"
        f"  - {{name: trainer-1, role: trainer, key: {TRAINER_KEY}}}\n"
        f"  - {{name: approver-1, role: approver, key: {APPROVER_KEY}}}\n"
    )
    gateway = session_gateway_factory(args=("--keys-file", str(keys)))
    with gateway.client() as api:
        question = ("What is 3 * 4 ?", "3 * 4", "12")
        post_rollout(api, "calc-1", calc_calls(*question, "12"), 1.0, step=0)
        post_rollout(api, "calc-2", calc_calls(*question, "13"), 0.0, outcome="failed", step=0)
        post_rollout(api, "calc-3", calc_calls(*question, "12"), 1.0, step=0)
        post_rollout(
            api,
            "calc-break",
            calc_calls("What is 7 + 5 ?", "7 + 5", "12", "12", rewritten=True),
            1.0,
            group="calc.s1.i0",
            step=1,
        )
        post_rollout(
            api,
            "calc-val",
            calc_calls("What is 2 - 9 ?", "2 - 9", "-7", "-7"),
            1.0,
            group="calc.val.i0",
            is_train=False,
        )
    return gateway


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (never a downloaded browser).

    One per module, not per session: Playwright's sync API keeps an event loop running while it is
    open, and the async tests of other modules could not start theirs."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install playwright; the browser is Debian's chromium)")
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        missing("Debian's Chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=list(CHROMIUM_ARGS)
        )
        yield launched
        launched.close()

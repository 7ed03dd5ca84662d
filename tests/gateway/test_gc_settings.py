"""The gateway's garbage-collector settings (`keraunos/gateway/_gc.py`): applied in a fresh
interpreter each, since the collector is the whole process's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from keraunos.gateway.config import GatewayConfig
from keraunos.testing.processes import start_gateway

PROBE = """
import gc, json, sys
from keraunos.gateway._gc import GcSettings, tune_gc
default = gc.get_threshold()
tune_gc(GcSettings(threshold0=int(sys.argv[1]), freeze=sys.argv[2] == "true"))
print(json.dumps({"default": default, "now": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def probe(threshold0: int, freeze: bool) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(threshold0), "true" if freeze else "false"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return json.loads(out)


def test_the_defaults_raise_the_young_threshold_and_freeze_what_start_up_left_alive() -> None:
    config = GatewayConfig()
    result = probe(config.gc_threshold, config.gc_freeze)
    default, now = result["default"], result["now"]
    assert isinstance(default, list) and isinstance(now, list)
    assert now == [10_000, default[1], default[2]]  # the older generations keep their settings
    assert isinstance(result["frozen"], int) and result["frozen"] > 1_000  # the imported modules


def test_zero_and_false_leave_the_collector_as_the_interpreter_set_it() -> None:
    result = probe(0, False)
    assert result["now"] == result["default"] and result["frozen"] == 0


def test_the_gateway_takes_both_settings_from_its_command_line(tmp_path: Path) -> None:
    gateway = start_gateway(tmp_path, args=("--gc-threshold", "0", "--gc-freeze", "false"))
    try:
        assert httpx.get(f"{gateway.base_url}/healthz", timeout=10).status_code == 200
    finally:
        gateway.stop()

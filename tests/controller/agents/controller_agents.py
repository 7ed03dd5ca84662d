"""Agents the controller tests run: real programs using the environment contract.

Imports stay inside `run()`, so an agent that needs nothing starts fast.

Each reads `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL` and `AGL_KEY`, as any agent does; some write what
they saw into a file named by a `NOTES` variable (set through `config.local.env_map`) so a test can
check it from outside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

#: Which process imported this module: a warm worker imports it once and forks the agents.
IMPORTED_BY = os.getpid()
#: Module state a run changes; another run of the same warm worker must not see the change.
RUNS_SEEN: list[str] = []


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}


def _note(**fields: object) -> None:
    """Append one JSON line to the file named by $NOTES (when set)."""
    path = os.environ.get("NOTES")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(fields) + "\n")


def reward(value: float) -> None:
    """Post a reward event to AGL_EVENT_URL with AGL_KEY."""
    import httpx

    body = {"event_type": "reward", "data": {"value": value}}
    httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=_headers(), timeout=30).raise_for_status()


class FailingAgent:
    """Always raises; the traceback's last line becomes the attempt's reason."""

    def run(self) -> None:
        raise RuntimeError(f"agent failed on purpose in {os.environ['AGL_EVENT_URL'].split('/attempt/')[1]}")


class HangingAgent:
    """Starts a child in its process group, ignores SIGTERM, and never returns on its own."""

    def run(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        _note(pgid=os.getpgid(0), pid=os.getpid(), child=child.pid)
        while True:
            time.sleep(1)


class ScopeProbingAgent:
    """Tries its AGL_KEY on another rollout's proxy path and events URL, and on its own; notes the statuses."""

    def run(self) -> None:
        import httpx

        own_base = os.environ["AGL_OPENAI_BASE_URL"]
        other = os.environ["OTHER_ROLLOUT"]
        rollout_part = own_base.split("/proxy/rollout/")[1].split("/")[0]
        other_base = own_base.replace(f"/proxy/rollout/{rollout_part}/", f"/proxy/rollout/{other}/")
        other_events = os.environ["AGL_EVENT_URL"].replace(
            f"/rollouts/{rollout_part}/", f"/rollouts/{other}/"
        )
        body = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with httpx.Client(headers=_headers(), timeout=30) as client:
            statuses = {
                "other_proxy": client.post(f"{other_base}/chat/completions", json=body).status_code,
                "other_events": client.post(
                    other_events, json={"event_type": "reward", "data": {}}
                ).status_code,
                "own_proxy": client.post(f"{own_base}/chat/completions", json=body).status_code,
                "key_is_token": os.environ["AGL_KEY"].startswith("kat1."),
            }
        _note(**statuses)


class FencedAgent:
    """Calls the model every 0.1 s until a call is refused; notes the refusing status and exits 0."""

    def run(self) -> None:
        import httpx

        body = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        url = os.environ["AGL_OPENAI_BASE_URL"] + "/chat/completions"
        deadline = time.monotonic() + 60
        with httpx.Client(headers=_headers(), timeout=30) as client:
            _note(started=True)
            while time.monotonic() < deadline:
                response = client.post(url, json=body)
                if response.status_code != 200:
                    _note(status=response.status_code, detail=response.json().get("detail"))
                    return
                time.sleep(0.1)


class WarmProbeAgent:
    """Notes who imported its module, what it sees of its environment and of earlier runs, its cwd."""

    def run(self) -> None:
        RUNS_SEEN.append(os.environ.get("RUN", "?"))
        print(f"probe run {os.environ.get('RUN')}", flush=True)
        _note(
            pid=os.getpid(),
            pgid=os.getpgid(0),
            imported_by=IMPORTED_BY,
            run=os.environ.get("RUN"),
            only_first=os.environ.get("ONLY_FIRST"),
            runs_seen=RUNS_SEEN,
            cwd=os.getcwd(),
        )
        os.chdir("/")  # must not move the next run
        if os.environ.get("FAIL"):
            raise SystemExit(int(os.environ["FAIL"]))

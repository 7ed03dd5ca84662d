"""Agents the controller tests run: real programs using the environment contract.

Imports stay inside `run()`, so an agent that needs nothing starts fast.

Each reads `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL` and `AGL_KEY`, as any agent does; some write what
they saw into a file named by a `NOTES` variable (set through `config.local.env_map`) so a test can
check it from outside.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}


def _note(**fields: object) -> None:
    """Append one JSON line to the file named by $NOTES (when set)."""
    path = os.environ.get("NOTES")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(fields) + "\n")


def _reward(value: float) -> None:
    import httpx

    body = {"event_type": "reward", "data": {"value": value}}
    httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=_headers(), timeout=30).raise_for_status()


class ChatAgent:
    """One chat call with the official `openai` client, a line on stdout, then a reward of 1.0."""

    def run(self) -> None:
        from openai import OpenAI

        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0
        )
        question = os.environ.get("QUESTION", "?")
        reply = client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": f"question {question}"}], max_tokens=4
        )
        print(f"agent saw {len(reply.choices)} choice(s) for question {question}", flush=True)
        _reward(1.0)


class AsyncChatAgent:
    """ChatAgent with an async `run()` and the async client."""

    async def run(self) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"], api_key=os.environ["AGL_KEY"], max_retries=0
        )
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "async question"}], max_tokens=4
        )
        await asyncio.to_thread(_reward, 0.5)


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

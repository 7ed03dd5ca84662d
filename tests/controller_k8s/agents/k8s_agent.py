"""The agent the Kubernetes stand-in runs as a Job's container: one model call, a reward, then a mode.

`python -m k8s_agent MODE [ARG]`, with `QUESTION` from the job template and the runner's
environment contract. Modes: `ok` (exit 0), `fail-first` (attempt 1 exits 3 after its call, later
attempts succeed), `wait FILE` (waits for FILE to exist before its call, so a test decides when the
agent ends). It uses httpx, not the openai package, to start quickly.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx

from keraunos.agent import api_key, attempt_id, emit_reward, openai_base_url


def main() -> int:
    mode = sys.argv[1]
    if mode == "wait":
        release = Path(sys.argv[2])
        print(f"waiting for {release}", flush=True)
        while not release.exists():
            time.sleep(0.05)
    response = httpx.post(
        f"{openai_base_url()}/chat/completions",
        headers={"Authorization": f"Bearer {api_key()}"},
        json={"model": "any", "messages": [{"role": "user", "content": os.environ.get("QUESTION", "")}]},
        timeout=30,
    )
    response.raise_for_status()
    print("answer:", response.json()["choices"][0]["message"]["content"], flush=True)
    emit_reward(1.0)
    if mode == "fail-first" and attempt_id() == "1":
        print("ValueError: the first attempt always gives up", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

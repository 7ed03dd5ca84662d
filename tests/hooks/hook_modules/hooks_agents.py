"""The tiny agent of the hook tests: posts the reward its input names and exits 0, or fails.

Its input arrives as JSON in $AGENT_INPUT (`config.local.env_map`): `{"reward": 0.5}` posts that
reward; `{"fail": true}` raises after posting nothing; `{"sleep_s": 1}` first sleeps.
"""

from __future__ import annotations

import json
import os
import time


class RewardAgent:
    """Posts `input.reward` to AGL_EVENT_URL (when given) and succeeds; `input.fail` fails."""

    def run(self) -> None:
        import httpx

        task = json.loads(os.environ.get("AGENT_INPUT", "{}") or "{}")
        time.sleep(float(task.get("sleep_s", 0)))
        if task.get("fail"):
            raise RuntimeError("the task says fail")
        if task.get("reward") is not None:
            body = {"event_type": "reward", "data": {"value": task["reward"]}}
            headers = {"Authorization": f"Bearer {os.environ['AGL_KEY']}"}
            httpx.post(os.environ["AGL_EVENT_URL"], json=body, headers=headers, timeout=30).raise_for_status()

"""A scripted optimizer model for the end-to-end optimisation tests: an OpenAI-compatible server
(`python rules_optimizer.py PORT`) that answers keraunos' proposer requests for the hidden-rules
task the way a good optimizer model would, deterministically.

It reads the template (the first `<prompt>` block of the request), the rules the shown rollouts'
tasks required (`Required rules: a, b`) and the rules a critique named (`Missing rules: a, b`):
a critique answers which required rules the template does not state; an edit adds one missing rule
per template asked for; a reflection adds the first missing rule; a merge keeps both templates'
rules. A stand-in for a real model (issue 19's real run uses one); not part of the package.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

_TEMPLATE = re.compile(r"<prompt>\n(.*?)\n</prompt>", re.DOTALL)
_REQUIRED = re.compile(r"Required rules: ([a-z, ]+)\.")
_MISSING = re.compile(r"Missing rules: ([a-z, ]+)")
_COUNT = re.compile(r"Write (\d+) different improved templates")


def rules_of(template: str) -> list[str]:
    return [line.strip()[5:] for line in template.splitlines() if line.strip().startswith("rule:")]


def with_rule(template: str, rule: str) -> str:
    return f"{template}\nrule:{rule}"


def names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def answer(system: str, user: str) -> str:
    templates = _TEMPLATE.findall(user)
    template = templates[0] if templates else ""
    stated = set(rules_of(template))
    required = sorted({rule for match in _REQUIRED.findall(user) for rule in names(match)})
    missing = [rule for rule in required if rule not in stated]
    if system.startswith("You combine"):
        merged = templates[0]
        for rule in rules_of(templates[1]) if len(templates) > 1 else []:
            if rule not in rules_of(merged):
                merged = with_rule(merged, rule)
        return f"<prompt>{merged}</prompt>"
    if "Do not rewrite the template" in system:
        return f"Missing rules: {', '.join(missing)}" if missing else "Nothing is missing."
    if "critique of what it makes" in system:
        named = [n for match in _MISSING.findall(user) for n in names(match) if n not in stated]
        asked = _COUNT.search(user)
        count = int(asked.group(1)) if asked else 1
        edits = [with_rule(template, rule) for rule in named[:count]]
        return "\n".join(f"<prompt>{edit}</prompt>" for edit in edits) or "I have no edit."
    # a reflection
    return f"<prompt>{with_rule(template, missing[0])}</prompt>" if missing else "It is fine as it is."


async def chat(request: Request) -> JSONResponse:
    body: dict[str, Any] = await request.json()
    messages = body.get("messages") or []
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    user = "\n".join(m["content"] for m in messages if m.get("role") == "user")
    text = answer(system, user)
    return JSONResponse(
        {
            "id": "chatcmpl-rules",
            "object": "chat.completion",
            "model": body.get("model", "rules"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": len(user.split()),
                "completion_tokens": len(text.split()),
                "total_tokens": 0,
            },
        }
    )


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")

"""Helpers of the redaction tests: a scripted chat model server.

A module of its own (not conftest.py) so test modules import it by a name no other test directory
uses. The engine stand-in only ever answers `w<id>` words, so a secret in the model's reply needs a
server that says what the test chose; this one is as small as what the gateway sends it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast


class ScriptedModel(ThreadingHTTPServer):
    """A chat model server that answers each call with the next text of `replies` (vLLM's shape:
    `prompt_token_ids` from `prompt_ids(messages)`, the reply's `token_ids` from `encode(text)`, a
    log prob per reply token)."""

    def __init__(self, prompt_ids: Callable[[Any], list[int]], encode: Callable[[str], list[int]]) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.prompt_ids = prompt_ids
        self.encode = encode
        self.replies: list[str] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _ScriptedHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server = cast(ScriptedModel, self.server)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = server.replies.pop(0) if server.replies else "ok"
        ids = server.encode(reply)
        answer = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "model": body.get("model"),
            "prompt_token_ids": server.prompt_ids(body["messages"]),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                    "token_ids": ids,
                    "logprobs": {
                        "content": [
                            {
                                "token": f"t{i}",
                                "logprob": -0.5,
                                "top_logprobs": [{"token": reply, "logprob": -1.0}],
                            }
                            for i in ids
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(ids), "total_tokens": 1 + len(ids)},
        }
        raw = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass

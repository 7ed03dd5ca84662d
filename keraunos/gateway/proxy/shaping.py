"""What the proxy sends upstream for an agent's request (pure): the shaping rules of docs/protocol.md#proxy.

The agent's body is forwarded as it is, except: `model` becomes the served model, `temperature` the
mode's configured value, `return_token_ids` is switched on (vLLM then returns prompt and response
token ids) and, in train mode, `logprobs` too (the trainer needs the sampled tokens' log probs).

In the legacy completions API `logprobs` is not a switch but the number of alternatives per token
(0 = only the sampled token's log prob). There the proxy keeps an agent's count and sends 0 when
the agent set none: vLLM would read `true` as 1 (pydantic's lax mode), stricter servers refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling parameters the upstream call actually used, for the record."""

    temperature: float
    top_p: Any

    def as_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p}


def shape_request(
    body: dict[str, Any], *, served_model: str, mode: str, temperature: float, path: str = "chat/completions"
) -> tuple[dict[str, Any], Sampling]:
    """The body to send upstream for the agent's `body` to `path`, and the sampling it asks for.

    `body` is not changed; `top_logprobs` and every other field stay as the agent set them.
    """
    shaped = dict(body)
    shaped["model"] = served_model
    shaped["temperature"] = temperature
    shaped["return_token_ids"] = True
    if mode == "train":
        if path == "completions":
            count = body.get("logprobs")
            is_count = isinstance(count, int) and not isinstance(count, bool) and count >= 0
            shaped["logprobs"] = count if is_count else 0
        else:
            shaped["logprobs"] = True
    return shaped, Sampling(temperature=temperature, top_p=shaped.get("top_p"))

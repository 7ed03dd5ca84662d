"""The policy: a local Hugging Face causal LM, and the log probs it gives response tokens.

`response_logprobs` scores a padded batch the way the model server samples from it: the logits of
the position before each response token, in float32, divided by the temperature the row was
sampled at, then `log_softmax` and the token's entry (see `keraunos.serving.sampling`). Position ids
are the ones given with the rows (left-padded prompts start at 0), the attention mask hides the
padding, and dropout stays off, so for the same weights and temperature the trainer's log probs
equal the sampler's.

Also where the policy runs (`pick_device`) and how it trades compute for memory
(`enable_gradient_checkpointing`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch

from keraunos.errors import KeraunosError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLoadError(KeraunosError, RuntimeError):
    """A model directory could not be loaded as a causal LM with its tokenizer."""


def load_policy(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) from a local `save_pretrained` directory, on `device`, in eval mode.

    Eval mode turns dropout off: the policy trained must be the one that sampled. Nothing is
    downloaded; a missing or broken directory raises `PolicyLoadError` naming it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise PolicyLoadError(
            f"{path} is not a model directory (no config.json): pass a save_pretrained directory"
        )
    if dtype not in DTYPES:
        raise PolicyLoadError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype], "local_files_only": True}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise PolicyLoadError(f"cannot load the model in {path}: {error}") from error
    model.to(device)
    model.eval()
    return model, tokenizer


def response_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prompt_len: int,
    temperatures: torch.Tensor,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log probs (N, R) of the response ids `input_ids[:, prompt_len:]`, and optionally the entropy.

    Computed in float32 at each row's temperature (0 is scored at 1, as the sampler reports greedy
    tokens). The entropy (N, R) is that of the whole next-token distribution at that temperature,
    detached (a statistic, not a loss term). Values at padding positions are meaningless; mask them.
    """
    response_len = input_ids.shape[1] - prompt_len
    logits = _logits(model, input_ids, attention_mask, position_ids, keep=response_len + 1)[:, :-1]
    scale = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).to(logits.device)
    logprobs_all = torch.log_softmax(logits.float() / scale.float()[:, None, None], dim=-1)
    targets = input_ids[:, prompt_len:].to(logprobs_all.device)
    logprobs = logprobs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    return logprobs, entropy


def _logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, keep: int
) -> torch.Tensor:
    """The logits of the last `keep` positions (computed for those only when the model allows)."""
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if _accepts(model, "logits_to_keep"):
        return model(**inputs, logits_to_keep=keep).logits
    return model(**inputs).logits[:, -keep:]


def _accepts(model: Any, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def enable_gradient_checkpointing(model: Any) -> None:
    """transformers' gradient checkpointing, without putting the model in training mode.

    transformers checkpoints a block only while the block's `training` flag is set; setting that
    flag on the blocks alone (not their children) keeps dropout off, so log probs stay those of
    the served model.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False):
            module.training = True


def pick_device(device: str) -> str:
    """The torch device for `device` ('auto': CUDA when torch sees one, else CPU); `PolicyLoadError`
    when CUDA is asked for and torch sees none."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PolicyLoadError(f"device {device!r} asked for, but torch sees no CUDA device: use cpu or auto")
    return device

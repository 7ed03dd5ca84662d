"""The supervised warm start: next-token cross-entropy on the assistant turns of chat conversations.

Each conversation is tokenised message by message in the tiny model's ChatML layout
(`<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`); the loss covers each assistant message's content and
its `<|im_end|>` (what the model generates when it is served), nothing else. Batches are drawn
with a seeded generator, AdamW with a short warm-up and a cosine decay, on the CPU or one GPU.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from keraunos.examples.calc.conversation import Message

#: Label of positions that carry no loss (PyTorch's cross-entropy default).
IGNORE = -100


@dataclass(frozen=True)
class Example:
    """One tokenised conversation: its ids and, per id, whether the model is trained to produce it."""

    ids: list[int]
    trained: list[bool]


def tokenize_conversation(tokenizer: Any, messages: Sequence[Message]) -> Example:
    """Ids of the rendered conversation, with the assistant contents and their end markers trained."""
    pieces: list[tuple[str, bool]] = []
    for message in messages:
        assistant = message["role"] == "assistant"
        pieces += [
            (f"<|im_start|>{message['role']}\n", False),
            (message["content"], assistant),
            ("<|im_end|>", assistant),
            ("\n", False),
        ]
    encoded = tokenizer([text for text, _ in pieces], add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    trained: list[bool] = []
    for piece, (_, train) in zip(encoded, pieces, strict=True):
        ids.extend(piece)
        trained.extend([train] * len(piece))
    return Example(ids, trained)


def collate(
    examples: Sequence[Example], pad_id: int
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Right-padded (input ids, attention mask, labels) where labels are the next ids to predict."""
    width = max(len(e.ids) for e in examples)
    inputs, masks, labels = [], [], []
    for e in examples:
        pad = width - len(e.ids)
        inputs.append(e.ids + [pad_id] * pad)
        masks.append([1] * len(e.ids) + [0] * pad)
        # Position t predicts id t+1; it is trained when id t+1 is.
        shifted = [e.ids[t + 1] if e.trained[t + 1] else IGNORE for t in range(len(e.ids) - 1)]
        labels.append(shifted + [IGNORE] * (pad + 1))
    return inputs, masks, labels


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then a cosine decay to a tenth of it at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def supervised_warm_start(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Sequence[Message]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    on_step: Callable[[int, float], None] = lambda step, loss: None,
) -> list[float]:
    """Train `model` in place for `steps` AdamW steps on `conversations`; the loss of every step.

    `on_step(step, loss)` is called after each step (for a progress bar).
    """
    import torch

    examples = [tokenize_conversation(tokenizer, c) for c in conversations]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(f"sft-{seed}")
    model.train()
    losses = []
    warmup = max(1, steps // 20)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, lr, warmup)
        batch = rng.sample(examples, min(batch_size, len(examples)))
        inputs, masks, labels = (torch.tensor(t, device=device) for t in collate(batch, pad_id))
        logits = model(input_ids=inputs, attention_mask=masks).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach().item())
        on_step(step, losses[-1])
    model.eval()
    return losses

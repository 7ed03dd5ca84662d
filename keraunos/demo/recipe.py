"""What the demo's tiny model is and what it is warm-started on, as pure functions over plain data.

The story the demo tells: a tiny model cannot do arithmetic, but it can learn to copy. Its warm
start (a short supervised run) teaches it the calc agent's protocol with two habits, both of which
take two model calls:

- **use the calculator** (a share `tool_share` of the examples): `<calc>EXPR</calc>`, copying the
  question's expression, then, after `<result>VALUE</result>`, `<answer>VALUE</answer>`; right
  whenever it copies well;
- **answer from its own head** (the rest): a guessed number in plain words (no tag, so the agent
  sends its protocol reminder), then `<answer>GUESS</answer>`; the guess is never the right one.

So the warm-started policy earns roughly `tool_share` times its copying accuracy, and the
reinforcement learning that follows has one clear thing to discover: call the calculator.

The conversations are produced by the calc agent's own loop (`solve`) with a scripted model, so
they are exactly what the agent sends and parses; their text is also the tokenizer's corpus, so
the system prompt and the tags are a few tokens each.
"""

from __future__ import annotations

import hashlib
import json
import random

from pydantic import BaseModel, ConfigDict, Field

from keraunos.examples.calc.conversation import Message, solve
from keraunos.examples.calc.dataset import generate

#: Bumped whenever the meaning of a recipe changes (the data, the model builder, the SFT), so a
#: cached model from an older recipe is not reused.
RECIPE_FORMAT = 1
#: The ChatML markers the tiny model's chat template renders (keraunos.serving.tiny).
_START, _END = "<|im_start|>", "<|im_end|>"


class Recipe(BaseModel):
    """Everything that decides the prepared model; its hash names the cache entry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(default=0, description="Seed of the questions, the tokenizer, the weights and the SFT.")
    vocab_size: int = Field(
        default=640,
        ge=512,
        description="Most byte-level BPE entries, specials included (at least 512 are learned).",
    )
    hidden_size: int = Field(default=64, ge=16, description="Model width.")
    layers: int = Field(default=2, ge=1, description="Transformer layers.")
    heads: int = Field(default=4, ge=1, description="Attention heads.")
    kv_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    max_value: int = Field(default=9, ge=1, description="Largest integer in a question.")
    examples: int = Field(default=2000, ge=1, description="Warm-start conversations.")
    tool_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Share of warm-start conversations that use the calculator."
    )
    sft_steps: int = Field(default=800, ge=0, description="Supervised optimizer steps.")
    sft_batch_size: int = Field(default=16, ge=1, description="Conversations per supervised step.")
    sft_lr: float = Field(default=5e-3, gt=0, description="Supervised AdamW learning rate (cosine decay).")

    def digest(self) -> str:
        """A short stable hash of the recipe (and of `RECIPE_FORMAT`): the cache entry's name."""
        text = json.dumps({"format": RECIPE_FORMAT, **self.model_dump()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def scripted(replies: list[str]):  # -> Chat
    """A `Chat` that answers with `replies` in order, whatever it is asked."""
    queue = iter(replies)
    return lambda messages: next(queue)


def wrong_guess(answer: int, rng: random.Random) -> int:
    """A number of about the answer's size that is not the answer."""
    bound = max(9, 2 * abs(answer))
    while True:
        guess = rng.randint(0, bound) * (-1 if answer < 0 and rng.random() < 0.8 else 1)
        if guess != answer:
            return guess


def warm_start_replies(expression: str, answer: int, *, use_tool: bool, rng: random.Random) -> list[str]:
    """The two replies of one warm-start conversation (see the module docstring)."""
    if use_tool:
        return [f"<calc>{expression}</calc>", f"<answer>{answer}</answer>"]
    guess = wrong_guess(answer, rng)
    return [f"I think it is {guess}.", f"<answer>{guess}</answer>"]


def warm_start_conversation(question: str, replies: list[str]) -> list[Message]:
    """The messages the calc agent exchanges when the model replies with `replies`."""
    episode = solve(question, scripted(replies), max_turns=len(replies))
    return episode.messages


def questions(seed: int, rows: int, max_value: int) -> list[dict]:
    """Calc dataset rows (`question`, `answer`), two operands each."""
    return list(generate(rows, seed=seed, max_operands=2, max_value=max_value))


def warm_start_conversations(recipe: Recipe) -> list[list[Message]]:
    """`recipe.examples` conversations, a share `tool_share` of them using the calculator."""
    rng = random.Random(f"warm-start-{recipe.seed}")
    conversations = []
    for row in questions(recipe.seed + 10_000, recipe.examples, recipe.max_value):
        expression = row["question"].removeprefix("What is ").removesuffix("?")
        use_tool = rng.random() < recipe.tool_share
        replies = warm_start_replies(expression, row["answer"], use_tool=use_tool, rng=rng)
        conversations.append(warm_start_conversation(row["question"], replies))
    return conversations


def render(messages: list[Message]) -> str:
    """The conversation as the tiny model's ChatML template renders it (without a generation prompt)."""
    return "".join(f"{_START}{m['role']}\n{m['content']}{_END}\n" for m in messages)


def tokenizer_corpus(conversations: list[list[Message]], seed: int = 0) -> list[str]:
    """The text the tokenizer learns its merges from: the rendered warm-start conversations, then
    the tiny model's general corpus (the protocol alone has too few distinct words for 512 entries)."""
    from keraunos.serving.tiny import default_corpus

    return [render(messages) for messages in conversations] + default_corpus(seed)

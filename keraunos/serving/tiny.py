"""A tiny causal LM built from scratch on this machine: for tests, the demo and trying the server.

No download: a byte-level BPE tokenizer is trained on a small generated corpus (arithmetic
questions, answers and tool-call-like text) with the `tokenizers` library, wrapped in
`PreTrainedTokenizerFast` with a ChatML chat template, and a Qwen2-style model (a few layers,
hidden size 64) gets random weights from a seeded generator. Both are written with
`save_pretrained`, so the directory loads like any Hugging Face checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

#: The chat template: ChatML. The assistant's content is rendered verbatim (no strip), so a reply
#: sent back in a later turn renders to the same text it was generated as.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}"
    "{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PAD, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_WORDS = (
    "what is the answer result compute calculate number sum difference product please think step "
    "first then so final tool call calculator returned value equals plus minus times divided by "
    "hello you are a helpful assistant user question reply correct wrong try again yes no"
)


def default_corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    """Generated training text for the tokenizer: chat-formatted arithmetic and tool-call-like lines."""
    rng = random.Random(seed)
    words = _WORDS.split()
    corpus = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))
        corpus.append(
            f"{START}user\nWhat is {a} {op} {b}?{END}\n{START}assistant\n{phrase.capitalize()}. "
            f'<tool>calc("{a} {op} {b}")</tool>{END}\n{START}tool\n{result}{END}\n'
            f"{START}assistant\nThe answer is {result}.{END}\n"
        )
    return corpus


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 512, *, split_digits: bool = False
):  # -> PreTrainedTokenizerFast
    """A byte-level BPE tokenizer of `vocab_size` entries (specials included) trained on `corpus`.

    With `split_digits`, every digit is a token of its own (as in Llama and Qwen2), so a number
    is the same tokens wherever it appears and a small model can copy it digit by digit.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, START, END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=END, pad_token=PAD, model_max_length=1 << 20
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 1024,
    corpus: Iterable[str] | None = None,
    split_digits: bool = False,
) -> Path:
    """Write a tiny Qwen2-style model with random weights and its tokenizer to `path`; returns it.

    Same arguments, same files: the corpus, the BPE training and the weights are all seeded.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    tokenizer = build_tokenizer(
        default_corpus(seed) if corpus is None else corpus, vocab_size, split_digits=split_digits
    )
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(END), tokenizer.convert_tokens_to_ids(PAD)
    assert isinstance(eos_id, int) and isinstance(pad_id, int)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def has_model(path: str | Path) -> bool:
    """True when `path` holds a saved model (its config.json)."""
    return (Path(path) / "config.json").is_file()

"""The engine stand-in's deterministic tokenizer, sampler and log probabilities (pure, no I/O).

Words are whitespace-separated. The word `w123` is token 123; any other word is a stable hash
(crc32) into the word range `[0, vocab_size - 8)`; the last 8 ids are role markers. A chat prompt
is, for each message, its role marker then the ids of its words, and finally the assistant marker
(the generation prompt). Generated text is `"w<id> w<id> ..."` (completions put a space before
every token, chat before all but the first), so it tokenises back to exactly the generated ids and
an agent that sends the reply back as an assistant message makes the next prompt
`previous prompt + previous response + new messages`.

Sampling is a pure function of (seed, request seed, temperature, choice index, prompt ids); log
probabilities are a pure function of the token id, so a streamed and a non-streamed answer agree.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import numpy as np
import orjson

#: Role marker ids count back from the end of the vocabulary, in this order; unknown roles get "other".
ROLES = ("system", "user", "assistant", "tool", "developer", "function", "other")
N_SPECIAL = 8
_CACHE_LIMIT = 1 << 18
#: Memory the log-probability JSON caches may use per number of alternatives; once full, a cache keeps
#: what it has (a stable warm set beats evicting under uniformly random token ids).
_LOGPROB_CACHE_BYTES = 96 << 20


class PromptError(ValueError):
    """The request's prompt or messages cannot be tokenised; the message says why (a 400)."""


class Tokenizer:
    """Words to ids and back, role markers, sampling and log-probability JSON, with small caches."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.word_range = vocab_size - N_SPECIAL
        self.role_ids = {role: self.word_range + i for i, role in enumerate(ROLES)}
        self._words: dict[str, int] = {}
        # Per number of alternatives k: token id -> JSON of its entry (a token after a space).
        self._chat_entries: dict[int, dict[int, bytes]] = {}
        self._completion_entries: dict[int, dict[int, tuple[str, float, bytes]]] = {}

    # -- prompt side -------------------------------------------------------------------------------

    def word_id(self, word: str) -> int:
        """The id of one word: `w<n>` is n (canonical digits, n in the word range), else a hash."""
        digits = word[1:]
        if (
            word[:1] == "w"
            and digits.isascii()
            and digits.isdigit()
            and (digits == "0" or digits[0] != "0")
            and len(digits) <= 10
            and int(digits) < self.word_range
        ):
            return int(digits)
        return zlib.crc32(word.encode("utf-8", "surrogatepass")) % self.word_range

    def encode(self, text: str) -> list[int]:
        """The ids of the whitespace-separated words of `text`."""
        if text[:1] == "w":
            # Text made only of `w<n>` words, as this engine generates, is parsed in C without
            # per-word Python work, which keeps long prompts cheap: once " w" is a comma, only
            # digits and commas may remain, and JSON's grammar rejects leading zeros and empty items.
            digits = text[1:].encode("utf-8", "surrogatepass").replace(b" w", b",")
            if digits and not digits.translate(None, b"0123456789,"):
                try:
                    ids = orjson.loads(b"[" + digits + b"]")
                except orjson.JSONDecodeError:
                    pass
                else:
                    if max(ids) < self.word_range:
                        return ids
        words = self._words
        try:
            return [words[w] for w in text.split()]
        except KeyError:
            if len(words) > _CACHE_LIMIT:
                words.clear()
            ids = []
            for w in text.split():
                i = words.get(w)
                if i is None:
                    i = words[w] = self.word_id(w)
                ids.append(i)
            return ids

    def chat_prompt(self, messages: Any) -> list[int]:
        """Prompt ids of a chat: per message its role marker and words, then the assistant marker."""
        if not isinstance(messages, list) or not messages:
            raise PromptError("'messages' must be a non-empty list of message objects")
        ids: list[int] = []
        other = self.role_ids["other"]
        for position, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise PromptError(f"messages[{position}] must be an object with a string 'role'")
            ids.append(self.role_ids.get(message["role"], other))
            ids += self.encode(message_text(message, position))
        ids.append(self.role_ids["assistant"])
        return ids

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        """Prompt ids of each prompt of a completions request (a string, ids, or a list of either)."""
        if isinstance(prompt, str):
            return [self.encode(prompt)]
        if isinstance(prompt, list) and prompt:
            kinds = set(map(type, prompt))
            if kinds == {str}:
                return [self.encode(p) for p in prompt]
            if kinds == {int}:
                return [self._checked_ids(prompt)]
            if kinds == {list} and all(p and set(map(type, p)) == {int} for p in prompt):
                return [self._checked_ids(p) for p in prompt]
        raise PromptError("'prompt' must be a string, a list of token ids, or a non-empty list of either")

    def _checked_ids(self, ids: list[int]) -> list[int]:
        low, high = min(ids), max(ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise PromptError(f"Token id {bad} is out of vocabulary (vocab_size {self.vocab_size})")
        return ids

    # -- generation side ---------------------------------------------------------------------------

    def sample(
        self,
        prompt_ids: list[int],
        *,
        seed: int,
        request_seed: Any,
        temperature: Any,
        index: int,
        max_tokens: int,
        min_tokens: int,
        natural: tuple[int, int],
        ignore_eos: bool,
    ) -> tuple[list[int], str]:
        """Generated ids and finish reason ('length' when max_tokens was reached, else 'stop')."""
        # Python hashes ints, floats and tuples of them the same in every process (only str, bytes
        # and, before 3.12, None are salted), so this seed is stable across runs and machines.
        key = (seed, request_seed is None, request_seed or 0, temperature is None, temperature or 0.0, index)
        rng = random.Random(hash((key, tuple(prompt_ids))))
        length = max_tokens if ignore_eos else max(rng.randint(*natural), min_tokens)
        n = min(length, max_tokens)
        ids: list[int] = (np.frombuffer(rng.randbytes(4 * n), dtype=np.uint32) % self.word_range).tolist()
        return ids, "length" if n >= max_tokens else "stop"

    def text(self, ids: list[int], *, leading_space: bool) -> str:
        """The generated text of `ids`: `w<id>` words joined by spaces."""
        if not ids:
            return ""
        return (" w" if leading_space else "w") + " w".join(map(str, ids))

    @staticmethod
    def logprob(token: int) -> float:
        """The log probability reported for sampling `token` (it is always the most likely one)."""
        return -round(((token * 2654435761) & 0xFFFF) / 32768 + 0.001, 6)

    def top(self, token: int, k: int) -> list[tuple[int, float]]:
        """The `k` most likely tokens at a position where `token` was sampled, best first."""
        base = self.logprob(token)
        return [(token, base)] + [
            ((token + j) % self.word_range, round(base - 0.75 * j - 0.125, 6)) for j in range(1, k)
        ]

    def chat_logprobs(self, ids: list[int], k: int, *, first: bool) -> bytes:
        """JSON of `logprobs.content` entries for `ids`; `first`: ids start the message."""
        entries = self._chat_entries.setdefault(k, {})
        room = _LOGPROB_CACHE_BYTES // ((k + 1) * 90) - len(entries)
        parts: list[Any] = list(map(entries.get, ids))
        if None in parts:
            for position, token in enumerate(ids):
                if parts[position] is None:
                    entry = parts[position] = self._chat_entry(token, k, leading=True)
                    if room > 0:
                        entries[token] = entry
                        room -= 1
        if first and ids:  # the message's first token has no space before it
            parts[0] = self._chat_entry(ids[0], k, leading=False)
        return b"[" + b",".join(parts) + b"]"

    def _chat_entry(self, token: int, k: int, leading: bool) -> bytes:
        prefix = " " if leading else ""
        top = [
            {"token": text, "logprob": lp, "bytes": list(text.encode())}
            for text, lp in ((f"{prefix}w{t}", lp) for t, lp in self.top(token, max(k, 1)))
        ]
        chosen = top[0]
        return orjson.dumps({**chosen, "top_logprobs": top[:k]})

    def piece_logprobs(self, pieces: list[tuple[str, list[int]]], k: int) -> bytes:
        """JSON of `logprobs.content` entries of scripted text: each (text, ids) piece that is one
        token is named by its text, as an engine names what it streamed; other ids by `w<id>`."""
        entries = []
        for text, ids in pieces:
            for token in ids:
                name = text if len(ids) == 1 else f" w{token}"
                best, *others = self.top(token, max(k, 1))
                top = [(name, best[1])] + [(f" w{t}", lp) for t, lp in others]
                listed = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top]
                entries.append({**listed[0], "top_logprobs": listed[:k]})
        return orjson.dumps(entries)

    def completion_logprobs(self, ids: list[int], k: int, *, text_offset: int) -> dict[str, Any]:
        """The completions `logprobs` object of `ids` (`k` alternatives, at least the sampled one)."""
        cache = self._completion_entries.setdefault(k, {})
        room = _LOGPROB_CACHE_BYTES // ((max(k, 1) + 1) * 60) - len(cache)
        tokens, logprobs, tops, offsets = [], [], [], []
        for token in ids:
            entry = cache.get(token)
            if entry is None:
                alternatives = self.top(token, max(k, 1))
                top = orjson.dumps({f" w{t}": lp for t, lp in alternatives})
                entry = (f" w{token}", alternatives[0][1], top)
                if room > 0:
                    cache[token] = entry
                    room -= 1
            tokens.append(entry[0])
            logprobs.append(entry[1])
            tops.append(entry[2])
            offsets.append(text_offset)
            text_offset += len(entry[0])
        return {
            "text_offset": offsets,
            "token_logprobs": logprobs,
            "tokens": tokens,
            "top_logprobs": orjson.Fragment(b"[" + b",".join(tops) + b"]"),
        }


def message_text(message: dict[str, Any], position: int) -> str:
    """The text a message's prompt ids are the words of: its content's text, then each tool call's
    name and arguments (`position` names the message in the error of a malformed content)."""
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            elif isinstance(part, str):
                pieces.append(part)
        text = " ".join(pieces)
    else:
        raise PromptError(f"messages[{position}].content must be a string, a list of parts or null")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                text += f" {function.get('name', '')} {function.get('arguments', '')}"
    return text

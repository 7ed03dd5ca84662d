"""Small fakes at the three seams of a search, over a toy task: each instance asks for one word, and
a template earns reward 1 on it when it contains that word (the reply of its one turn names the
word it missed). Every fake records what it was asked, so tests can read what the search did."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keraunos.optimize.types import Candidate, Evaluation, Instance, Lineage, Split, Turn

Score = Callable[[str, Instance], float]


def word_score(template: str, instance: Instance) -> float:
    return 1.0 if instance.input in template.split() else 0.0


def instances(prefix: str, words: Sequence[str]) -> list[Instance]:
    return [Instance(id=f"{prefix}{n}", input=word) for n, word in enumerate(words)]


@dataclass
class FakeStore:
    """Versions from 1 in the order stored; the same template again is the version already stored."""

    stored: list[tuple[str, Lineage]] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)

    async def store(self, template: str, lineage: Lineage) -> Candidate:
        self.stored.append((template, lineage))
        version = self.versions.setdefault(template, len(self.versions) + 1)
        return Candidate(version=version, template=template, lineage=lineage)


@dataclass
class FakeEvaluator:
    """Scores every asked pair with `score`; `asked` lists every (version, split, instance id)."""

    score: Score = word_score
    asked: list[tuple[int, Split, str]] = field(default_factory=list)

    async def evaluate(
        self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split
    ) -> list[Evaluation]:
        await asyncio.sleep(0)
        out = []
        for candidate in candidates:
            for instance in instances:
                self.asked.append((candidate.version, split, instance.id))
                reward = self.score(candidate.template, instance)
                reply = "ok" if reward >= 1 else f"missed {instance.input}"
                turn = Turn(messages=({"role": "system", "content": candidate.template},), reply=reply)
                out.append(
                    Evaluation(
                        version=candidate.version,
                        instance_id=instance.id,
                        split=split,
                        rollout_id=f"ro-{candidate.version}-{split}-{instance.id}",
                        reward=reward,
                        turns=(turn,),
                    )
                )
        return out


def missed_words(evaluations: Sequence[Evaluation]) -> list[str]:
    words = [t.reply.removeprefix("missed ") for e in evaluations for t in e.turns if t.reply != "ok"]
    return sorted(set(words))


@dataclass
class FakeProposer:
    """Adds the words the failures missed: `edit` one per child (child k the k-th missing word),
    `reflect` all of them, `merge` the union of both templates' words. `calls` records every call
    as (operator, template, what it was given)."""

    calls: list[tuple[str, str, object]] = field(default_factory=list)

    async def critique(self, template: str, failures: Sequence[Evaluation]) -> str:
        self.calls.append(("critique", template, tuple(e.instance_id for e in failures)))
        return "add " + " ".join(missed_words(failures))

    async def edit(self, template: str, critique: str, count: int) -> list[str]:
        self.calls.append(("edit", template, (critique, count)))
        words = critique.removeprefix("add ").split()
        return [f"{template} {word}" for word in words[:count]]

    async def reflect(self, template: str, evaluations: Sequence[Evaluation]) -> str:
        self.calls.append(("reflect", template, tuple(e.instance_id for e in evaluations)))
        return " ".join([template, *missed_words(evaluations)])

    async def merge(self, first: str, second: str) -> str:
        self.calls.append(("merge", first, second))
        words = first.split()
        return " ".join(words + [w for w in second.split() if w not in words])


@dataclass
class ScriptedProposer(FakeProposer):
    """Answers from `answers` (operator -> replies, used in order, the last one repeated)."""

    answers: dict[str, list[object]] = field(default_factory=dict)

    def _next(self, operator: str) -> object:
        replies = self.answers[operator]
        return replies.pop(0) if len(replies) > 1 else replies[0]

    async def critique(self, template: str, failures: Sequence[Evaluation]) -> str:
        await super().critique(template, failures)
        return str(self._next("critique")) if "critique" in self.answers else "add more"

    async def edit(self, template: str, critique: str, count: int) -> list[str]:
        self.calls.append(("edit", template, (critique, count)))
        reply = self._next("edit")
        assert isinstance(reply, list)
        return [str(t) for t in reply]

    async def reflect(self, template: str, evaluations: Sequence[Evaluation]) -> str:
        self.calls.append(("reflect", template, tuple(e.instance_id for e in evaluations)))
        return str(self._next("reflect"))

    async def merge(self, first: str, second: str) -> str:
        self.calls.append(("merge", first, second))
        return str(self._next("merge"))

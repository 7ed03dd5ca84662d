"""The seams of prompt optimisation: what a search reads, asks and writes (pure data and protocols).

A search (`beam`, `pareto`, `random`) holds candidates — templates of one prompt resource, each
stored as a resource version with its lineage — and spends a budget of *evaluations*: one rollout of
one candidate on one instance. Three things are passed in, so the search itself does no I/O:

- an `Evaluator` runs candidates on instances and returns one `Evaluation` per pair (in production:
  val-mode rollouts through the gateway and the controller, the candidate assigned per rollout);
- a `Proposer` writes new templates from failures (in production: an optimizer model behind any
  OpenAI-compatible endpoint);
- a `CandidateStore` records each new template as a resource version and says which number it got.

Determinism is the resume story: given the same seed, the same evaluations and the same proposer
answers, a search makes the same choices. An evaluation is keyed by (run, candidate version, split,
instance), so re-running a killed search re-reads finished evaluations instead of paying again, and a
proposer call is keyed by its exact request, so its recorded answer is reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Split = Literal["train", "val"]
Operator = Literal["seed", "edit", "reflect", "merge", "random"]


@dataclass(frozen=True, slots=True)
class Instance:
    """One task of the dataset: an id unique in the dataset, and the rollout input the agent gets."""

    id: str
    input: Any


@dataclass(frozen=True, slots=True)
class Lineage:
    """Where a candidate came from: the operator, its parents' versions, and the proposer's text
    that led to it (the critique for `edit`, the reflection for `reflect`; empty for `seed`)."""

    operator: Operator
    parents: tuple[int, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A prompt template the search holds, with the resource version that stores it."""

    version: int
    template: str
    lineage: Lineage


@dataclass(frozen=True, slots=True)
class Turn:
    """One recorded model call of an evaluation's rollout, as reflection reads it: the messages
    sent and the reply's text."""

    messages: tuple[dict[str, Any], ...]
    reply: str


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One candidate on one instance: the rollout that ran it, its reward (0.0 when the rollout
    recorded none or failed), whether it failed, and its model calls (for reflection)."""

    version: int
    instance_id: str
    split: Split
    rollout_id: str
    reward: float
    failed: bool = False
    turns: tuple[Turn, ...] = field(default=())


class Evaluator(Protocol):
    async def evaluate(
        self, candidates: Sequence[Candidate], instances: Sequence[Instance], split: Split
    ) -> list[Evaluation]:
        """Every candidate on every instance (len(candidates) * len(instances) evaluations, in the
        order candidate-major), run concurrently; a finished evaluation is read, not re-run."""
        ...


class Proposer(Protocol):
    async def critique(self, template: str, failures: Sequence[Evaluation]) -> str:
        """What the template makes the agent get wrong, from the failed evaluations' calls."""
        ...

    async def edit(self, template: str, critique: str, count: int) -> list[str]:
        """Up to `count` edited templates that address `critique` (fewer when the model wrote fewer)."""
        ...

    async def reflect(self, template: str, evaluations: Sequence[Evaluation]) -> str:
        """One improved template, from the template's evaluations (failures and successes) at once."""
        ...

    async def merge(self, first: str, second: str) -> str:
        """One template combining what each of two good templates gets right."""
        ...


class CandidateStore(Protocol):
    async def store(self, template: str, lineage: Lineage) -> Candidate:
        """Record `template` as a version of the optimised resource (its lineage in the version's
        message and parent); the same template again gives the version already stored."""
        ...

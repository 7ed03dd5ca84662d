"""Completed rollouts to training rows: exact trajectory merging, padding, masks (pure NumPy).

Two levels:
- `transition`: one row per call (its prompt, its response).
- `trajectory`: consecutive calls of a rollout share one row while each call's prompt starts,
  token id for token id, with the previous call's prompt + response (`keraunos.prefix.extends`,
  or the reader's `Triplet.extends_previous` where it built the ids so). The ids in between (tool
  output, user turns, chat-template glue) join the response with mask 0 and log prob 0; the next
  call's response follows with mask 1. A prompt that does not continue the row (a *break*) starts a
  new row, and the break is classified and counted (`MergeBreak`).

Every row is a left-padded prompt of `max_prompt_len` followed by a right-padded response of
`max_response_len`. A prompt over its limit drops the row (a cut prompt is not what the model saw);
a response over its limit is cut, and the cut is counted. Rows with no trainable token are skipped.
A row keeps its old log probs only when every call in it has one finite log prob per response
token; otherwise `logprobs_valid` is False and the row's `old_logprobs` are 0. Each row carries its
rollout's reward at its last response token.

A call may hold several samples of its prompt (the choices of an `n > 1` call, and earlier calls
with the same prompt that the triplet view folded into it). Only the sample the agent went on with
earned the rollout's reward, so only it trains: the one a later call's prompt continues (the first
later call that starts with this prompt shows it; the longest sample wins when several fit). The
others are left out and counted (`abandoned_samples`). When nothing shows it (the last call, or the
conversation went on without any of them), `TrajectoryConfig.unresolved_samples` decides: `drop`
(default) trains none of them, `first_choice` trains the first choice of the latest call (what
v1.0's triplet view reads); either way the call is counted (`unresolved_calls`, and the samples
left out in `unresolved_samples_dropped`) and a log line names the rollouts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, Field

from keraunos import prefix
from keraunos.training._data import CompletedRollout, Sample, Triplet

log = structlog.get_logger("keraunos.training.trajectories")

Level = Literal["transition", "trajectory"]
UnresolvedSamples = Literal["drop", "first_choice"]
BreakKind = Literal["retokenization", "template", "rewrite", "unclassified"]
BREAK_KINDS: tuple[BreakKind, ...] = ("retokenization", "template", "rewrite", "unclassified")

#: Ids decoded before the first difference, so a break's texts start on a stable token boundary.
_BREAK_CONTEXT = 8


class Tokenizer(Protocol):
    """Anything that decodes ids to text (a Hugging Face tokenizer qualifies)."""

    def decode(self, token_ids: list[int]) -> str:
        """The text of `token_ids`."""
        ...


class TrajectoryConfig(BaseModel):
    """How rollouts become rows."""

    model_config = ConfigDict(extra="forbid")

    level: Level = Field(
        default="trajectory", description="`transition`: a row per call; `trajectory`: merged."
    )
    max_prompt_len: int = Field(default=4096, ge=1, description="Prompt ids per row (left-padded).")
    max_response_len: int = Field(default=4096, ge=1, description="Response ids per row (right-padded).")
    pad_token_id: int = Field(default=0, description="Id written into padding positions.")
    unresolved_samples: UnresolvedSamples = Field(
        default="drop",
        description="A call with several samples of its prompt and no later call showing which one "
        "the agent went on with: `drop` trains none, `first_choice` the first choice of its latest call.",
    )


@dataclass(frozen=True, slots=True)
class MergeBreak:
    """A call whose prompt did not continue the previous call's prompt + response.

    `kind`: `retokenization` (decoded texts agree, ids do not), `template` (texts agree but for
    whitespace), `rewrite` (the history changed: truncation, summarisation, an edited turn) or,
    without a tokenizer, `rewrite` when the difference lies before the previous response and
    `unclassified` otherwise. `shared_prefix` counts the ids both have in common. The texts, decoded
    from a few ids before the difference, are None without a tokenizer.
    """

    rollout_id: str
    call_index: int
    kind: BreakKind
    shared_prefix: int
    expected_text: str | None = None
    actual_text: str | None = None


@dataclass(frozen=True)
class Rows:
    """Training rows as plain NumPy arrays (N rows, P = max_prompt_len, R = max_response_len).

    `input_ids`, `attention_mask`, `position_ids`: (N, P + R), prompt left-padded then response
    right-padded; positions count the real ids from 0 and are 0 on padding. `response_mask`: (N, R), 1 exactly on model-generated ids. `token_rewards`: (N, R),
    the rollout's reward at the row's last response id. `old_logprobs`: (N, R), 0 where masked or
    where `logprobs_valid` (N,) is False. `rewards`, `rollout_index` (into the rollouts given),
    `first_call`, `n_calls`: (N,). `rollout_ids`, `data_ids`: (N,) object arrays of str.
    `call_index`: (N, R), the index (into its rollout's triplets) of the call whose response holds
    each response position, -1 on the ids in between and on padding: where per-call advantages land
    (`keraunos.training.credit`).
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    response_mask: np.ndarray
    token_rewards: np.ndarray
    old_logprobs: np.ndarray
    logprobs_valid: np.ndarray
    rewards: np.ndarray
    rollout_index: np.ndarray
    first_call: np.ndarray
    n_calls: np.ndarray
    rollout_ids: np.ndarray
    data_ids: np.ndarray
    prompt_len: int
    call_index: np.ndarray

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class BuildResult:
    """The rows, every merge break, and counters (`rows`, `calls`, `breaks_<kind>`, drops, cuts)."""

    rows: Rows
    breaks: list[MergeBreak]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Draft:
    """A row being built: its prompt and its response pieces (ids, trainable?, log probs)."""

    prompt: np.ndarray
    first_call: int
    pieces: list[tuple[np.ndarray, bool, np.ndarray | None]] = field(default_factory=list)
    n_calls: int = 0
    untrained: list[int] = field(default_factory=list)  # response positions that never train

    def add_call(self, triplet: Triplet, gap: np.ndarray | None) -> None:
        if gap is not None and gap.size:
            self.pieces.append((gap, False, None))
        if triplet.untrained is not None:  # a redaction placeholder's ids
            offset = sum(len(piece[0]) for piece in self.pieces)
            self.untrained.extend((offset + triplet.untrained).tolist())
        self.pieces.append((triplet.response_ids, True, triplet.logprobs))
        self.n_calls += 1


def build_rows(
    rollouts: Sequence[CompletedRollout], config: TrajectoryConfig, tokenizer: Tokenizer | None = None
) -> BuildResult:
    """Rows of every rollout, in rollout order, with merge breaks and counters.

    With a tokenizer, each break carries both decoded texts and a text-based kind.
    """
    counts: Counter[str] = Counter()
    breaks: list[MergeBreak] = []
    drafts: list[tuple[int, _Draft]] = []
    left_out: list[str] = []
    for index, rollout in enumerate(rollouts):
        counts["calls"] += len(rollout.triplets)
        before = counts["abandoned_samples"] + counts["unresolved_samples_dropped"]
        calls = trained_calls(rollout.triplets, config.unresolved_samples, counts)
        if counts["abandoned_samples"] + counts["unresolved_samples_dropped"] > before:
            left_out.append(rollout.rollout_id)
        for draft in _drafts(rollout.rollout_id, calls, config.level, tokenizer, breaks):
            drafts.append((index, draft))
    if left_out:
        log.info(
            "samples left out of training: the agent went on with another, or nothing shows which",
            abandoned_samples=counts["abandoned_samples"],
            unresolved_calls=counts["unresolved_calls"],
            unresolved_samples_dropped=counts["unresolved_samples_dropped"],
            unresolved_samples=config.unresolved_samples,
            rollouts=len(left_out),
            rollout_ids=left_out[:8],
        )
    for merge_break in breaks:
        counts[f"breaks_{merge_break.kind}"] += 1
    rows = _pack(rollouts, drafts, config, counts)
    metrics: dict[str, float] = {"rows": float(len(rows)), "rollouts": float(len(rollouts))}
    metrics["breaks"] = float(len(breaks))
    for kind in BREAK_KINDS:
        metrics[f"breaks_{kind}"] = float(counts[f"breaks_{kind}"])
    for key in (
        "calls",
        "multi_sample_calls",
        "abandoned_samples",
        "unresolved_calls",
        "unresolved_samples_dropped",
        "prompt_too_long_rows",
        "truncated_rows",
        "truncated_tokens",
        "no_trainable_rows",
        "logprobs_missing_rows",
    ):
        metrics[key] = float(counts[key])
    return BuildResult(rows, breaks, metrics)


@dataclass(frozen=True, slots=True)
class TrainedCall:
    """A call as rows see it: `triplet` holds the one sample that trains (None: none does), and
    `samples` every sample of its prompt, for naming a break after it. `extends_previous` is the
    reader's flag (its prompt starts with the previous call's prompt + first sample), `first_sample`
    whether `triplet` trains that first sample (the one a next call's flag is about)."""

    triplet: Triplet | None
    samples: tuple[Sample, ...]
    prompt_ids: np.ndarray
    extends_previous: bool = False
    first_sample: bool = True


def breaks_by_rollout(rollout_ids: Sequence[str], breaks: Sequence[MergeBreak]) -> dict[str, int]:
    """How many of `breaks` fell in each rollout of `rollout_ids` (0 for one without any), in that
    order; a rollout split into views (one per agent) counts the breaks of all its views."""
    counts = dict.fromkeys(rollout_ids, 0)
    for merge_break in breaks:
        counts[merge_break.rollout_id] = counts.get(merge_break.rollout_id, 0) + 1
    return counts


def trained_calls(
    triplets: Sequence[Triplet], unresolved: UnresolvedSamples, counts: Counter[str]
) -> list[TrainedCall]:
    """Each call with the sample that trains: the one the agent went on with (see the module's
    docstring); counts `multi_sample_calls`, `abandoned_samples`, `unresolved_calls` and
    `unresolved_samples_dropped` into `counts`."""
    out: list[TrainedCall] = []
    for index, triplet in enumerate(triplets):
        if not triplet.alternatives:
            out.append(TrainedCall(triplet, (), triplet.prompt_ids, triplet.extends_previous))
            continue
        samples = triplet.samples
        counts["multi_sample_calls"] += 1
        chosen = followed_sample(triplet.prompt_ids, samples, triplets[index + 1 :])
        if chosen is not None:
            counts["abandoned_samples"] += len(samples) - 1
        else:
            counts["unresolved_calls"] += 1
            if unresolved == "first_choice":
                chosen = 0
                counts["unresolved_samples_dropped"] += len(samples) - 1
            else:
                counts["unresolved_samples_dropped"] += len(samples)
        kept = None
        if chosen is not None:
            sample = samples[chosen]
            kept = Triplet(triplet.prompt_ids, sample.response_ids, sample.logprobs, sample.model_version)
        out.append(TrainedCall(kept, samples, triplet.prompt_ids, triplet.extends_previous, chosen == 0))
    return out


def followed_sample(prompt: np.ndarray, samples: Sequence[Sample], later: Sequence[Triplet]) -> int | None:
    """The index of the sample that the first later call starting with `prompt` continues (the
    longest when several fit, the first of equal ones), or None when that call continues none of
    them or no later call starts with `prompt`."""
    for call in later:
        following = call.prompt_ids
        if prefix.extends(prompt, None, following) is None:
            continue  # another conversation (or a rewritten history): look further
        fits = [
            (len(sample.response_ids), -index)
            for index, sample in enumerate(samples)
            if prefix.extends(prompt, sample.response_ids, following) is not None
        ]
        return -max(fits)[1] if fits else None
    return None


def continued_at(call: TrainedCall, previous: TrainedCall) -> int | None:
    """Where `call`'s new ids begin when its prompt starts with `previous`'s prompt + trained
    response (`prefix.extends`), else None; the reader's flag spares the comparison when it applies."""
    before = previous.triplet
    if before is None:
        return None
    if call.extends_previous and previous.first_sample:
        return len(before.prompt_ids) + len(before.response_ids)
    return prefix.extends(before.prompt_ids, before.response_ids, call.prompt_ids)


def classify_break(
    previous: Triplet, prompt: np.ndarray, tokenizer: Tokenizer | None = None
) -> tuple[BreakKind, int, str | None, str | None]:
    """(kind, shared prefix, expected text, actual text) of a prompt that does not continue `previous`."""
    shared = prefix.shared_prefix(prompt, previous.prompt_ids, previous.response_ids)
    if tokenizer is None:
        kind: BreakKind = "rewrite" if shared < len(previous.prompt_ids) else "unclassified"
        return kind, shared, None, None
    expected = np.concatenate((previous.prompt_ids, previous.response_ids))
    start = max(0, shared - _BREAK_CONTEXT)
    expected_text = tokenizer.decode(expected[start:].tolist())
    # Enough of the new prompt to hold the same text even if it tokenises into twice as many ids.
    window = 2 * (len(expected) - start) + 2 * _BREAK_CONTEXT
    actual_text = tokenizer.decode(prompt[start : start + window].tolist())
    if actual_text.startswith(expected_text):
        kind = "retokenization"
    elif _squash(actual_text).startswith(_squash(expected_text)):
        kind = "template"
    else:
        kind = "rewrite"
    return kind, shared, expected_text, actual_text


def _squash(text: str) -> str:
    return "".join(text.split())


def _drafts(
    rollout_id: str,
    calls: list[TrainedCall],
    level: Level,
    tokenizer: Tokenizer | None,
    breaks: list[MergeBreak],
) -> list[_Draft]:
    drafts: list[_Draft] = []
    previous: TrainedCall | None = None
    open_draft = False  # whether drafts[-1] ends with `previous` (it can be extended)
    for call_index, call in enumerate(calls):
        triplet = call.triplet
        if level == "trajectory" and previous is not None:
            start = continued_at(call, previous) if open_draft else None
            if start is not None:
                previous = call
                if triplet is not None:
                    drafts[-1].add_call(triplet, triplet.prompt_ids[start:])
                else:  # it continues the row but trains nothing, so no later call extends the row
                    open_draft = False
                continue
            kind, shared, expected, actual = _classify_after(previous, call.prompt_ids, tokenizer)
            breaks.append(MergeBreak(rollout_id, call_index, kind, shared, expected, actual))
        previous = call
        open_draft = triplet is not None
        if triplet is not None:
            draft = _Draft(prompt=triplet.prompt_ids, first_call=call_index)
            draft.add_call(triplet, None)
            drafts.append(draft)
    return drafts


def _classify_after(
    previous: TrainedCall, prompt: np.ndarray, tokenizer: Tokenizer | None
) -> tuple[BreakKind, int, str | None, str | None]:
    """`classify_break` against the sample that trained, or, when none did, against the sample that
    shares the most ids with `prompt`."""
    if previous.triplet is not None:
        return classify_break(previous.triplet, prompt, tokenizer)
    candidates = [Triplet(previous.prompt_ids, s.response_ids) for s in previous.samples]
    closest = max(candidates, key=lambda t: classify_break(t, prompt)[1])
    return classify_break(closest, prompt, tokenizer)


def _pack(
    rollouts: Sequence[CompletedRollout],
    drafts: list[tuple[int, _Draft]],
    config: TrajectoryConfig,
    counts: Counter[str],
) -> Rows:
    """Lay the drafts out into padded arrays, dropping and cutting as the limits say."""
    p, r = config.max_prompt_len, config.max_response_len
    kept: list[tuple[int, _Draft, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]] = []
    for index, draft in drafts:
        ids, mask, calls = _layout(draft)
        if not mask.any():
            counts["no_trainable_rows"] += 1
            continue
        if len(draft.prompt) > p:
            counts["prompt_too_long_rows"] += 1
            continue
        logprobs = _row_logprobs(draft, len(ids))
        if len(ids) > r:
            counts["truncated_rows"] += 1
            counts["truncated_tokens"] += int(mask[r:].sum())
            ids, mask, calls = ids[:r], mask[:r], calls[:r]
            logprobs = logprobs[:r] if logprobs is not None else None
        if not mask.any():
            counts["no_trainable_rows"] += 1
            continue
        if logprobs is None:
            counts["logprobs_missing_rows"] += 1
        kept.append((index, draft, ids, mask, logprobs, calls))

    n = len(kept)
    input_ids = np.full((n, p + r), config.pad_token_id, dtype=np.int64)
    attention = np.zeros((n, p + r), dtype=np.int8)
    response_mask = np.zeros((n, r), dtype=np.int8)
    token_rewards = np.zeros((n, r), dtype=np.float32)
    old_logprobs = np.zeros((n, r), dtype=np.float32)
    logprobs_valid = np.zeros(n, dtype=bool)
    rewards = np.zeros(n, dtype=np.float32)
    rollout_index = np.zeros(n, dtype=np.int64)
    first_call = np.zeros(n, dtype=np.int64)
    n_calls = np.zeros(n, dtype=np.int64)
    position_ids = np.zeros((n, p + r), dtype=np.int64)
    rollout_ids = np.empty(n, dtype=object)
    data_ids = np.empty(n, dtype=object)
    call_index = np.full((n, r), -1, dtype=np.int64)
    for row, (index, draft, ids, mask, logprobs, calls) in enumerate(kept):
        rollout = rollouts[index]
        n_prompt, n_response = len(draft.prompt), len(ids)
        input_ids[row, p - n_prompt : p] = draft.prompt
        input_ids[row, p : p + n_response] = ids
        attention[row, p - n_prompt : p + n_response] = 1
        position_ids[row, p - n_prompt : p + n_response] = np.arange(n_prompt + n_response)
        response_mask[row, :n_response] = mask
        call_index[row, :n_response] = calls
        token_rewards[row, n_response - 1] = rollout.reward
        if logprobs is not None:
            old_logprobs[row, :n_response] = np.where(mask, logprobs, 0.0)
            logprobs_valid[row] = True
        rewards[row] = rollout.reward
        rollout_index[row] = index
        first_call[row] = draft.first_call
        n_calls[row] = draft.n_calls
        rollout_ids[row] = rollout.rollout_id
        data_ids[row] = rollout.group_id
    return Rows(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        response_mask=response_mask,
        token_rewards=token_rewards,
        old_logprobs=old_logprobs,
        logprobs_valid=logprobs_valid,
        rewards=rewards,
        rollout_index=rollout_index,
        first_call=first_call,
        n_calls=n_calls,
        rollout_ids=rollout_ids,
        data_ids=data_ids,
        prompt_len=p,
        call_index=call_index,
    )


def _layout(draft: _Draft) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draft's response ids, which of them train, and the call each belongs to (-1 between calls)."""
    ids = np.concatenate([piece[0] for piece in draft.pieces])
    mask = np.zeros(len(ids), dtype=bool)
    calls = np.full(len(ids), -1, dtype=np.int64)
    offset = 0
    call = draft.first_call  # a draft's calls are consecutive, one trainable piece each
    for piece_ids, trainable, _ in draft.pieces:
        if trainable:
            mask[offset : offset + len(piece_ids)] = True
            calls[offset : offset + len(piece_ids)] = call
            call += 1
        offset += len(piece_ids)
    if draft.untrained:
        mask[np.asarray(draft.untrained)] = False
    return ids, mask, calls


@dataclass(frozen=True)
class Trajectory:
    """One row of a rollout before padding and limits, for looking at it (the dashboard):
    `prompt_ids` (its first call's prompt), `response_ids`, `mask` (which of them train), `call_index`
    (the call whose response holds each id, -1 on the ids in between), `logprobs` (0 in between;
    None when a call's are missing) and `first_call`."""

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    mask: np.ndarray
    call_index: np.ndarray
    logprobs: np.ndarray | None
    first_call: int


def trajectories(
    rollout: CompletedRollout, config: TrajectoryConfig, tokenizer: Tokenizer | None = None
) -> tuple[list[Trajectory], list[MergeBreak]]:
    """The rows `build_rows` would make of `rollout`, unpadded and uncut, with its merge breaks."""
    breaks: list[MergeBreak] = []
    calls = trained_calls(rollout.triplets, config.unresolved_samples, Counter())
    out: list[Trajectory] = []
    for draft in _drafts(rollout.rollout_id, calls, config.level, tokenizer, breaks):
        ids, mask, call_index = _layout(draft)
        out.append(
            Trajectory(draft.prompt, ids, mask, call_index, _row_logprobs(draft, len(ids)), draft.first_call)
        )
    return out, breaks


def _row_logprobs(draft: _Draft, n: int) -> np.ndarray | None:
    """The row's log probs (0 on gaps), or None when any call's are missing."""
    if any(
        trainable and (logprobs is None or len(logprobs) != len(ids))
        for ids, trainable, logprobs in draft.pieces
    ):
        return None
    out = np.zeros(n, dtype=np.float32)
    offset = 0
    for ids, trainable, logprobs in draft.pieces:
        if trainable and logprobs is not None:
            out[offset : offset + len(ids)] = logprobs
        offset += len(ids)
    return out

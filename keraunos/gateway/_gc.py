"""How the gateway sets CPython's cyclic garbage collector up (benchmarks/results/2026-11-30/proxy3.md).

A proxied call parses a model response into a few hundred dicts and lists (one per generated
token's log probs), which live until the call is recorded. Under load, with calls waiting for the
ledger, CPython's young-generation passes (every 700 allocations by default) keep finding them
alive and promote them, so full collections follow, and each full collection walks every object the
process holds, most of them from importing the web stack, pydantic, numpy: ~145 ms per pass, ~20 %
of the gateway's time at 64 concurrent calls on the benchmark machine. None of those objects is
cyclic garbage; reference counting frees the calls' data.

So, once the application is built: `gc.freeze()` moves everything alive into the permanent
generation, which no collection walks again, and the young-generation threshold goes up, so fewer
passes promote calls that are merely in flight. Cyclic garbage is still collected, only in larger
and rarer passes.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GcSettings:
    """`threshold0`: allocations between young-generation passes (0 leaves CPython's setting);
    `freeze`: move what is alive at start-up out of every later collection."""

    threshold0: int
    freeze: bool


def tune_gc(settings: GcSettings) -> None:
    """Apply `settings` to this process's collector; call it once the application is built."""
    if settings.threshold0 > 0:
        _, threshold1, threshold2 = gc.get_threshold()
        gc.set_threshold(settings.threshold0, threshold1, threshold2)
    if settings.freeze:
        gc.collect()  # what is garbage already should not be kept for ever
        gc.freeze()

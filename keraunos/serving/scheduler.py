"""Batching concurrent requests: one scheduler task gathers queued sequences into one batch.

A request submits its sequences (n choices of each prompt) as a `Job` and reads its tokens from the
job's queue. The scheduler waits for the first job, keeps collecting for `batch_wait_s` (or until
`max_batch_size` sequences are gathered), then runs the whole batch in a worker thread, so the
event loop keeps serving streams and health checks meanwhile. Sequences that arrive during a batch
wait for the next one (no joining mid-batch: simple and exact). A job larger than the batch size
runs alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from keraunos.serving.metrics import ServeMetrics
from keraunos.serving.runner import ModelRunner, SequenceRequest, TokenEvent

log = structlog.get_logger("keraunos.serving")


@dataclass
class Job:
    """The sequences of one request; `events` receives `(choice index, TokenEvent)` pairs in order.

    When the batch that ran them failed, `events` receives `(-1, exception)` instead.
    """

    sequences: list[SequenceRequest]
    events: asyncio.Queue[tuple[int, TokenEvent | BaseException]] = field(default_factory=asyncio.Queue)


class BatchScheduler:
    """Gathers jobs into batches and runs them on a `ModelRunner`, one batch at a time.

    Batch sizes, generation time, tokens and the queue go to `metrics` (the server's, or its own).
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_batch_size: int,
        batch_wait_s: float,
        metrics: ServeMetrics | None = None,
    ) -> None:
        self.runner = runner
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.metrics = metrics or ServeMetrics()
        self.batches = 0
        self.largest_batch = 0
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the scheduler task on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="keraunos-batch-scheduler")

    async def stop(self) -> None:
        """Stop the scheduler task (a batch in its worker thread finishes on its own)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(
        self, make: Callable[[Callable[[int], Callable[[TokenEvent], None]]], list[SequenceRequest]]
    ) -> Job:
        """Queue a job; `make(emitter_of)` builds its sequences, `emitter_of(i)` is choice i's `emit`."""
        loop = asyncio.get_running_loop()
        job = Job(sequences=[])

        def emitter_of(index: int) -> Callable[[TokenEvent], None]:
            def emit(event: TokenEvent) -> None:
                loop.call_soon_threadsafe(job.events.put_nowait, (index, event))

            return emit

        job.sequences = make(emitter_of)
        self._queue.put_nowait(job)
        self.metrics.waiting.inc()
        return job

    async def _run(self) -> None:
        pending: Job | None = None
        while True:
            jobs = [pending or await self._queue.get()]
            pending = None
            size = len(jobs[0].sequences)
            deadline = asyncio.get_running_loop().time() + self.batch_wait_s
            while size < self.max_batch_size:
                timeout = deadline - asyncio.get_running_loop().time()
                try:
                    job = (
                        self._queue.get_nowait()
                        if timeout <= 0
                        else await asyncio.wait_for(self._queue.get(), timeout)
                    )
                except (TimeoutError, asyncio.QueueEmpty):
                    break
                if size + len(job.sequences) > self.max_batch_size:
                    pending = job  # it starts the next batch
                    break
                jobs.append(job)
                size += len(job.sequences)
            await self._run_batch(jobs, size)

    async def _run_batch(self, jobs: list[Job], size: int) -> None:
        self.batches += 1
        self.largest_batch = max(self.largest_batch, size)
        sequences = [s for job in jobs for s in job.sequences]
        metrics = self.metrics
        metrics.waiting.dec(len(jobs))
        metrics.running.set(size)
        metrics.batch_size.observe(size)
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.runner.generate, sequences)
        except Exception as exc:  # a bug or an out-of-memory: every request of the batch fails with a 500
            metrics.batch_failures.inc()
            log.exception("batch failed", sequences=size)
            for job in jobs:
                job.events.put_nowait((-1, exc))
        finally:
            metrics.batch_seconds.observe(time.perf_counter() - started)
            metrics.running.set(0)
            # What the model did, also when it failed part way: the tokens it did sample.
            metrics.prompt_tokens.inc(sum(len(s.prompt) for s in sequences))
            metrics.completion_tokens.inc(sum(len(s.generated) for s in sequences))

"""Concurrent requests collected into shared decodes, behind a bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import defaultdict, deque
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

from nmt.decode.options import DecodeOptions
from nmt.serve.backend import Backend, decode_thread

log = logging.getLogger(__name__)

# sentences * beam of one call to the backend: a decode of more is split into calls of this
# size, and a request whose client has gone by the next call is not decoded (a call cannot be
# stopped). At 256, greedy decodes up to max_batch_sentences' default and beam-5 decodes of
# single-sentence clients stay one call; CTranslate2 splits into calls of 160 rows anyway.
DECODE_ROWS = 256


class Overloaded(Exception):
    """The queue has no room for a request: answered 503, with ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Hooks(Protocol):
    """What the batcher reports (:class:`nmt.serve.metrics.Metrics`)."""

    def decoded(self, sentences: int, seconds: float) -> None: ...
    def cancelled(self, reason: str) -> None: ...


@dataclass(eq=False)  # a job is itself: the queue removes it by identity
class Job:
    sources: list[list[int]]
    key: tuple[int, float, bool]  # beam, length penalty, attention: what a decode shares
    future: asyncio.Future
    deadline: float  # the event loop's time after which the job is not decoded
    queued: bool = field(default=True)
    forced: list[int] | None = None  # each sentence's first output token (a target tag)


class Batcher:
    """Collects the sentences of concurrent requests into shared decodes.

    Up to ``backend.concurrency`` decodes run at once. For a free one, the worker takes the
    first waiting request, then every request already waiting or arriving within ``wait_s``,
    up to ``max_sentences`` sentences; with several decodes, up to an equal share of the
    sentences in the server (waiting or decoding), so that the decodes stay about equal and a
    lone request starts at once on an idle worker. Requests that arrive while every decode is
    busy wait for the next free one. Decodes run on ``executor`` (a :class:`DecodeProcess` or a
    :func:`decode_thread`; a new thread if not given). Counters: ``batches`` (decodes run),
    ``sentences``, ``requests``.

    At most ``max_queued`` sentences wait: :meth:`submit` refuses a request beyond that with
    :class:`Overloaded` at once. A request leaves the queue when its caller stops waiting (its
    task cancelled: the client went away) or at its deadline (``TimeoutError``), and is then
    never decoded; a decode already running finishes and its answer is dropped.
    """

    def __init__(
        self,
        backend: Backend,
        wait_s: float,
        max_sentences: int,
        executor: Executor | None = None,
        max_queued: int = 1 << 62,
        hooks: Hooks | None = None,
    ) -> None:
        self.backend = backend
        self.wait_s = wait_s
        self.max_sentences = max_sentences
        self.max_queued = max_queued
        self.hooks = hooks
        self.jobs: deque[Job] = deque()  # waiting, oldest first
        self.arrived = asyncio.Event()
        self.waiting = 0  # sentences in the queue
        self.executor = executor or decode_thread(backend.concurrency)
        self.batches = self.sentences = self.requests = 0
        self.cancelled = 0  # requests that left the queue undecoded
        self.rate = 0.0  # sentences/s of recent decodes (for Retry-After)
        self.slots = asyncio.Semaphore(backend.concurrency)  # one per decode that may run
        self.decoding = 0  # sentences the running decodes hold
        self.task: asyncio.Task | None = None
        self.decodes: set[asyncio.Task] = set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in [self.task, *self.decodes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.executor.shutdown(wait=True)

    def room(self) -> int:
        """Sentences the queue still takes."""
        return self.max_queued - self.waiting

    def retry_after(self) -> int:
        """Seconds until the queue has drained at the recent decode rate (1 to 60)."""
        if self.rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self.waiting / self.rate)))

    def check_room(self, sentences: int) -> None:
        if sentences > self.room():
            raise Overloaded(
                f"the server is busy: {self.waiting} sentences wait (at most "
                f"{self.max_queued}); this request has {sentences}",
                self.retry_after(),
            )

    async def submit(
        self,
        sources: list[list[int]],
        opts: DecodeOptions,
        attention: bool,
        deadline: float,
        forced: list[int] | None = None,
    ) -> list:
        """The outputs of ``sources`` (``forced``: each one's first output token, a
        multilingual model's target tag); :class:`Overloaded` when the queue has no room for
        them, ``TimeoutError`` when they are not decoded by ``deadline`` (the loop's time).
        Requests for different target languages share a decode."""
        self.check_room(len(sources))
        future = asyncio.get_running_loop().create_future()
        key = (opts.beam, opts.length_penalty, attention)
        job = Job(sources, key, future, deadline, forced=forced)
        self.requests += 1
        self.waiting += len(sources)
        self.jobs.append(job)
        self.arrived.set()
        try:
            async with asyncio.timeout_at(deadline):
                return await future
        except TimeoutError:
            self._drop(job, "deadline")
            raise
        except asyncio.CancelledError:  # the handler was cancelled: the client went away
            self._drop(job, "disconnected")
            raise

    def _drop(self, job: Job, reason: str) -> None:
        """A job whose caller stopped waiting leaves the queue (one decoding finishes, and its
        answer is dropped: its future is done)."""
        if job.queued:
            job.queued = False
            self.jobs.remove(job)
            self.waiting -= len(job.sources)
            self.cancelled += 1
            if self.hooks is not None:
                self.hooks.cancelled(reason)

    def _next(self) -> Job | None:
        """The oldest job still wanted; a job past its deadline is dropped here."""
        now = asyncio.get_running_loop().time()
        while self.jobs:
            job = self.jobs[0]
            if job.future.done():  # its caller is gone
                self._drop(job, "disconnected")
                continue
            if now >= job.deadline:  # before the caller's own timeout has run
                job.future.set_exception(TimeoutError())
                self._drop(job, "deadline")
                continue
            self.jobs.popleft()
            job.queued = False
            self.waiting -= len(job.sources)
            return job
        return None

    async def _get(self, timeout: float | None = None) -> Job | None:
        """The next job, waiting for one (at most ``timeout`` seconds: then None)."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            job = self._next()
            if job is not None:
                return job
            self.arrived.clear()
            if end is None:
                await self.arrived.wait()
                continue
            remaining = end - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self.arrived.wait(), remaining)
            except TimeoutError:
                return None

    async def _collect(self) -> list[Job]:
        loop = asyncio.get_running_loop()
        first = await self._get()
        assert first is not None  # no timeout: a job comes
        jobs = [first]
        count = len(first.sources)
        deadline = loop.time() + self.wait_s
        while count < self._limit(count):
            job = await self._get(deadline - loop.time())
            if job is None:
                break
            jobs.append(job)
            count += len(job.sources)
        return jobs

    def _limit(self, count: int) -> int:
        """Sentences a new decode takes: all it can, or with several decodes its share of the
        sentences in the server (``count`` taken, those waiting and those decoding)."""
        slots = self.backend.concurrency
        if slots == 1:
            return self.max_sentences
        return min(self.max_sentences, -(-(count + self.waiting + self.decoding) // slots))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.slots.acquire()  # a decode may start: collect its requests
            jobs = await self._collect()
            groups: dict[tuple, list[Job]] = defaultdict(list)
            for job in jobs:
                groups[job.key].append(job)
            for i, (key, members) in enumerate(groups.items()):
                if i > 0:  # each further search waits for a slot of its own
                    await self.slots.acquire()
                members = [job for job in members if not job.future.done()]
                if not members:  # every caller went away while a slot was awaited
                    self.slots.release()
                    continue
                self.decoding += sum(len(job.sources) for job in members)
                task = loop.create_task(self._decode(key, members))
                self.decodes.add(task)
                task.add_done_callback(self.decodes.discard)

    async def _decode(self, key: tuple[int, float, bool], members: list[Job]) -> None:
        """The sentences of ``members`` in calls of at most ``DECODE_ROWS // beam``: before
        each, the sentences of requests whose caller has gone are dropped; a request is answered
        as soon as its last sentence is decoded."""
        beam, alpha, attention = key
        opts = replace(self.backend.defaults, beam=beam, length_penalty=alpha)
        loop = asyncio.get_running_loop()
        rows = [
            (job, ids, None if job.forced is None else job.forced[i])
            for job in members
            for i, ids in enumerate(job.sources)
        ]
        size = max(1, DECODE_ROWS // beam)
        done: dict[Job, list] = {job: [] for job in members}
        left = len(rows)  # sentences still counted in self.decoding
        try:
            for at in range(0, len(rows), size):
                part = [row for row in rows[at : at + size] if not row[0].future.done()]
                start = loop.time()
                outputs = []
                if part:
                    decode = self.backend.decode
                    if any(r[2] is not None for r in part):  # -1: no forced token
                        firsts = [-1 if r[2] is None else r[2] for r in part]
                        decode = partial(decode, forced=firsts)
                    outputs = await loop.run_in_executor(
                        self.executor, decode, [r[1] for r in part], opts, attention
                    )
                    self._count(len(part), loop.time() - start)
                taken = min(size, len(rows) - at)
                self.decoding -= taken
                left -= taken
                for (job, _, _), output in zip(part, outputs, strict=True):
                    done[job].append(output)
                    if len(done[job]) == len(job.sources) and not job.future.done():
                        job.future.set_result(done[job])
        except Exception as e:  # the requests get a 500 with the reason; serving goes on
            log.exception("decoding failed")
            for job in members:
                if not job.future.done():
                    job.future.set_exception(e)
        finally:
            self.decoding -= left
            self.slots.release()

    def _count(self, sentences: int, seconds: float) -> None:
        """A call decoded ``sentences`` in ``seconds``."""
        self.batches += 1
        self.sentences += sentences
        if seconds > 0:
            rate = sentences * self.backend.concurrency / seconds
            self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate
        if self.hooks is not None:
            self.hooks.decoded(sentences, seconds)

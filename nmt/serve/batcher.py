"""Concurrent requests collected into shared decodes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from nmt.decode.options import DecodeOptions
from nmt.serve.backend import Backend, decode_thread

log = logging.getLogger(__name__)


@dataclass
class Job:
    sources: list[list[int]]
    key: tuple[int, float, bool]  # beam, length penalty, attention: what a decode shares
    future: asyncio.Future


class Batcher:
    """Collects the sentences of concurrent requests into shared decodes.

    Up to ``backend.concurrency`` decodes run at once. For a free one, the worker takes the
    first waiting request, then every request already waiting or arriving within ``wait_s``,
    up to ``max_sentences`` sentences; with several decodes, up to an equal share of the
    sentences in the server (waiting or decoding), so that the decodes stay about equal and a
    lone request starts at once on an idle worker. Requests that arrive while every decode is
    busy wait for the next free one. Decodes run on ``executor`` (:func:`decode_thread`; a new
    one if not given). Counters: ``batches`` (decodes run), ``sentences``, ``requests``.
    """

    def __init__(
        self,
        backend: Backend,
        wait_s: float,
        max_sentences: int,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.backend = backend
        self.wait_s = wait_s
        self.max_sentences = max_sentences
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.waiting = 0  # sentences in the queue
        self.executor = executor or decode_thread(backend.concurrency)
        self.batches = self.sentences = self.requests = 0
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

    async def submit(self, sources: list[list[int]], opts: DecodeOptions, attention: bool) -> list:
        future = asyncio.get_running_loop().create_future()
        self.requests += 1
        self.waiting += len(sources)
        await self.queue.put(Job(sources, (opts.beam, opts.length_penalty, attention), future))
        return await future

    def _take(self, job: Job) -> Job:
        self.waiting -= len(job.sources)
        return job

    async def _collect(self) -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs = [self._take(await self.queue.get())]
        count = len(jobs[0].sources)
        deadline = loop.time() + self.wait_s
        while count < self._limit(count):
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            jobs.append(self._take(job))
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
                self.decoding += sum(len(job.sources) for job in members)
                task = loop.create_task(self._decode(key, members))
                self.decodes.add(task)
                task.add_done_callback(self.decodes.discard)

    async def _decode(self, key: tuple[int, float, bool], members: list[Job]) -> None:
        beam, alpha, attention = key
        sources = [s for job in members for s in job.sources]
        opts = replace(self.backend.defaults, beam=beam, length_penalty=alpha)
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.backend.decode, sources, opts, attention
            )
        except Exception as e:  # the requests get a 500 with the reason; serving goes on
            log.exception("decoding failed")
            for job in members:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        finally:
            self.decoding -= len(sources)
            self.slots.release()
        self.batches += 1
        self.sentences += len(sources)
        start = 0
        for job in members:
            part = outputs[start : start + len(job.sources)]
            start += len(job.sources)
            if not job.future.done():
                job.future.set_result(part)

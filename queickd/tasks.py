"""Tasks and job handles: `@q.task(**options)` on a module-level function.

    q = JobQueue()

    @q.task(retry=True, max_attempts=5, pool="io")
    def add(a, b):
        return a + b

    add(1, 2)                              # 3: still the plain function
    job = add.enqueue(1, 2, priority=5)    # a JobHandle; the decorator's options, overridden
    job.result(timeout=10)                 # 3, or raises JobFailed / JobCancelled / TimeoutError
    job = await add.aenqueue(1, 2)         # an AsyncJobHandle: `await job.result(10)`

A task sends what JobQueue.enqueue(add, args=(1, 2), **options) sends: the function's
'module:name', which the daemon imports as it always did (it finds the task object there
and calls it, which calls the function). Decorating opens no connection: the queue
connects on first use, so the daemon and tests import a module of tasks with no daemon
running.

A task of a JobQueue awaits through an AsyncJobQueue with the same address and token,
made by the JobQueue on the first `aenqueue`; a task of an AsyncJobQueue only awaits
(a blocking enqueue inside an event loop would stall it). This module builds on both
clients and imports neither: a task asks its queue (`_sync_queue`, `_async_queue`) for
the kind it needs. A task and its handles are as thread-safe as the queue they use.
Standard library only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

from . import clientops
from .core.cron import SchedulingTime
from .core.job import State

# A JobQueue or an AsyncJobQueue: named, not imported, since both clients import this
# module to make their tasks.
JobQueue = AsyncJobQueue = Any

__all__ = ["AsyncJobHandle", "JobCancelled", "JobFailed", "JobHandle", "Task"]

P = ParamSpec("P")
R = TypeVar("R")


class JobFailed(Exception):  # noqa: N818  (named for what happened, as TimeoutError is not)
    """The job is dead: it raised (on its last attempt), timed out or was killed. Carries
    the error the daemon stored: `error_type`, `message`, `traceback` (the job's, as text)."""

    def __init__(self, job: dict[str, Any]) -> None:
        err = job.get("error") or {}
        self.job = job
        self.job_id: int = job["id"]
        self.error_type: str = err.get("type", "")
        self.message: str = err.get("message", "")
        self.traceback: str | None = err.get("traceback")
        super().__init__(f"job {self.job_id} failed: {self.error_type}: {self.message}")


class JobCancelled(Exception):  # noqa: N818
    """The job was cancelled before it finished; it has no result."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.job_id: int = job["id"]
        super().__init__(f"job {self.job_id} was cancelled")


def outcome(job: dict[str, Any]) -> Any:
    """A final job's result, or its failure raised."""
    if job["state"] == State.SUCCEEDED:
        return job.get("result")
    if job["state"] == State.CANCELLED:
        raise JobCancelled(job)
    raise JobFailed(job)


class _Handle:
    def __init__(self, queue: JobQueue | AsyncJobQueue, job_id: int) -> None:
        self.queue = queue
        self.id = job_id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}>"


class JobHandle(_Handle):
    """A job stored by the daemon, seen through a JobQueue: `id`, and calls that block."""

    def get(self) -> dict[str, Any]:
        """The job as stored now (state, attempts, result, error, ...)."""
        return self.queue.get(self.id)

    def wait(self, timeout: float = 30.0) -> dict[str, Any]:
        """Block until the job is final (succeeded, dead or cancelled); returns it. Raises
        TimeoutError after `timeout` seconds."""
        return self.queue.wait(self.id, timeout)

    def result(self, timeout: float = 30.0) -> Any:
        """Block until the job is final: its return value; JobFailed if it died, with its
        stored error; JobCancelled; TimeoutError after `timeout` seconds."""
        return outcome(self.queue.wait(self.id, timeout))

    def cancel(self) -> dict[str, Any]:
        return self.queue.cancel(self.id)


class AsyncJobHandle(_Handle):
    """A job stored by the daemon, seen through an AsyncJobQueue: `id`, and coroutines."""

    async def get(self) -> dict[str, Any]:
        return await self.queue.get(self.id)

    async def wait(self, timeout: float = 30.0) -> dict[str, Any]:
        return await self.queue.wait(self.id, timeout)

    async def result(self, timeout: float = 30.0) -> Any:
        """As JobHandle.result."""
        return outcome(await self.queue.wait(self.id, timeout))

    async def cancel(self) -> dict[str, Any]:
        return await self.queue.cancel(self.id)


def check_importable(func: Any) -> None:
    """TypeError unless the daemon can import func by its module and name."""
    if isinstance(func, (staticmethod, classmethod)) or not inspect.isfunction(func):
        raise TypeError(f"@task decorates a function defined at the top level of a module, not {func!r}")
    name = func.__qualname__
    if func.__name__ == "<lambda>":
        raise TypeError(f"@task cannot decorate a lambda ({func.__module__}:{name}): the daemon imports a job's "
                        "function by its name; define it with def at the top level of a module")
    if func.__module__ == "__main__":  # enqueue would refuse it: say why now, and what works
        raise TypeError(f"@task cannot decorate {name} of the script being run (__main__): the daemon imports a "
                        "job's function by its module and cannot import a script, so a script cannot enqueue a "
                        "function it defines itself; move the function to a module of its own and import it "
                        "from there (calling it and enqueueing it then both work)")
    if "<locals>" in name:
        raise TypeError(f"@task cannot decorate {name} of {func.__module__}: it is defined inside a function, so "
                        "the daemon cannot import it by name; move it to the top level of the module")
    if "." in name:
        raise TypeError(f"@task cannot decorate the method {name} of {func.__module__}: the daemon imports a job's "
                        "function by module and name; make it a function at the top level of the module")


_JOB_SIGNATURE = inspect.signature(clientops.job)


class Task(Generic[P, R]):
    """A job function with the options to enqueue it with. Calling it calls the function."""

    def __init__(self, queue: JobQueue | AsyncJobQueue, func: Callable[P, R], options: dict[str, Any]) -> None:
        check_importable(func)
        try:  # an unknown option is refused now, not at the first enqueue
            _JOB_SIGNATURE.bind(func, **options)
        except TypeError as e:
            raise TypeError(f"@task options are JobQueue.enqueue's: {e}") from None
        functools.update_wrapper(self, func)  # __module__ and __name__: what the daemon looks up
        self.queue = queue
        self.func = func
        self.options = options

    def __repr__(self) -> str:
        return f"<Task {self.func.__module__}:{self.func.__qualname__}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def spec(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
        """The wire form of one call, for JobQueue.enqueue_many: JobQueue.job(func, args,
        kwargs, **options) with the decorator's options overridden."""
        return clientops.job(self.func, args, kwargs, **self._options(overrides))

    def _options(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {**self.options, **overrides} if overrides else self.options

    @property
    def _sync(self) -> JobQueue:
        return self.queue._sync_queue()

    @property
    def _async(self) -> AsyncJobQueue:
        return self.queue._async_queue()

    # Positional arguments are the function's; keywords are JobQueue.enqueue's, overriding
    # the decorator's options, and the function's keyword arguments go in `kwargs={...}`:
    # a misspelt option is a TypeError, never an argument the job did not expect.
    def enqueue(self, *args: Any, **overrides: Any) -> JobHandle:
        """Queue a call of the function. Returns a JobHandle once the job is stored."""
        q = self._sync
        return JobHandle(q, q.enqueue(self.func, args, **self._options(overrides)))

    def enqueue_at(self, when: float | SchedulingTime, *args: Any, **overrides: Any) -> JobHandle:
        """Queue a call to run at unix time `when` (or a SchedulingTime's start)."""
        return self.enqueue(*args, **overrides, run_at=clientops.run_at(when))

    def enqueue_in(self, seconds: float, *args: Any, **overrides: Any) -> JobHandle:
        """Queue a call to run `seconds` from now, by the daemon's clock."""
        return self.enqueue(*args, **overrides, delay=seconds)

    def cron(self, schedule: SchedulingTime | str, *args: Any, name: str | None = None,
             **overrides: Any) -> dict[str, Any]:
        """Run the function on a schedule (a SchedulingTime or a 5-field cron string), as
        JobQueue.cron. Returns the cron as the daemon stored it."""
        return self._sync.cron(schedule, self.func, args, name=name, **self._options(overrides))

    def many(self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], **overrides: Any) -> list[JobHandle]:
        """One job per (args, kwargs), stored in one request and one transaction, all or
        none (JobQueue.enqueue_many). Returns their handles, in order."""
        q = self._sync
        return [JobHandle(q, i) for i in q.enqueue_many([self.spec(a, k, **overrides) for a, k in calls])]

    async def aenqueue(self, *args: Any, **overrides: Any) -> AsyncJobHandle:
        """As enqueue, through an AsyncJobQueue; returns an AsyncJobHandle."""
        q = self._async
        return AsyncJobHandle(q, await q.enqueue(self.func, args, **self._options(overrides)))


@overload
def queue_task(queue: Any, func: Callable[P, R], /) -> Task[P, R]: ...
@overload
def queue_task(queue: Any, func: None = None, /, **options: Any) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def queue_task(queue: JobQueue | AsyncJobQueue, func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """JobQueue.task and AsyncJobQueue.task: `@q.task` or `@q.task(**options)` on a function
    at the top level of a module: a Task, still the function when called, whose
    .enqueue(...) queues a call of it with these options (any of enqueue's). Connects to
    nothing."""
    if func is not None:
        return Task(queue, func, options)
    return lambda f: Task(queue, f, options)

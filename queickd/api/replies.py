"""How a refusal is said on each transport: `refused(why)` renders an admission `Refusal`,
a `QueueError`, a `NotCommittedError` or any other exception (a bug) as the TCP protocol's
error object, an HTTP status with its body and headers, or a Queick 1.2.1 client's error
string. It never logs nor decides whether to refuse. A failure whose commit may have
happened all the same (`maybe_committed`) says so, so that a client resends only with the
same idempotency key.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.job import Submitted
from ..core.policy.admission import RETRY_AFTER_DEFAULT, Refusal
from ..core.protocol import Code, QueueError

# HTTP statuses of the protocol's codes; an admission refusal is always 429 (the hook's
# key or the queue is full: try again later), whatever its code.
_HTTP_STATUS = {Code.BAD_REQUEST: 400, Code.UNAUTHORIZED: 401, Code.NOT_ALLOWED: 403, Code.NOT_FOUND: 404,
                Code.CONFLICT: 409, Code.QUEUE_FULL: 429, Code.INTERNAL: 500}
_NOT_COMMITTED_RETRY = "5"  # seconds an HTTP sender waits after a commit that failed


class NotCommittedError(Exception):
    """The commit holding a request failed or did not finish in time (`maybe_committed`, or
    its cause's, says whether it may have been committed all the same)."""

    def __init__(self, message: str, maybe_committed: bool = False) -> None:
        super().__init__(message)
        self.maybe_committed = maybe_committed


class Refused:
    """One refusal, rendered per transport on demand."""

    __slots__ = ("why",)

    def __init__(self, why: Refusal | BaseException) -> None:
        self.why = why

    def error(self) -> QueueError:
        """The refusal as the protocol's error (TCP's reply is its to_reply())."""
        why = self.why
        if isinstance(why, Refusal):
            return QueueError(why.code, why.message, why.retry_after, job_id=why.job_id)
        if isinstance(why, QueueError):
            return why
        # Whether it may have come after the commit took effect (a NotCommittedError, a
        # store's NotDurableError say so; so may the error that caused it).
        maybe = bool(getattr(why, "maybe_committed", False) or getattr(why.__cause__, "maybe_committed", False))
        if isinstance(why, NotCommittedError):
            if maybe:
                return QueueError(Code.INTERNAL, "not confirmed; it may have been stored (resend with the "
                                                 f"same idempotency key): {why}", maybe_committed=True)
            return QueueError(Code.INTERNAL, f"not accepted, try again: {why}")
        return QueueError(Code.INTERNAL, f"{type(why).__name__}: {why}", maybe_committed=maybe)

    def json(self) -> dict[str, Any]:
        """The TCP protocol's reply: {"ok": false, "error": {...}, "retry_after"?}."""
        return self.error().to_reply()

    def http(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, extra headers). A refusal says when to come back, in the body
        and in Retry-After, even when admission gave no time (a key's conflict)."""
        why = self.why
        if isinstance(why, Refusal):
            retry = why.retry_after if why.retry_after is not None else RETRY_AFTER_DEFAULT
            body = QueueError(why.code, why.message, retry, job_id=why.job_id).to_reply()
            return 429, body, {"Retry-After": str(max(1, math.ceil(retry)))}
        if isinstance(why, NotCommittedError):
            return 503, self.json(), {"Retry-After": _NOT_COMMITTED_RETRY}
        err = self.error()
        return _HTTP_STATUS.get(err.code, 500), self.json(), {}

    def legacy(self) -> str:
        """The `error` string of a Queick client's reply: an admission refusal names its code."""
        why = self.why
        if isinstance(why, Refusal):
            return f"{why.code}: {why.message}"
        return str(why)


def refused(why: Refusal | BaseException) -> Refused:
    return Refused(why)


def answer_reply(answer: list[Submitted] | Refusal, many: bool, warnings: list[str] | None = None) -> dict[str, Any]:
    """The TCP protocol's reply to one `enqueue` (or, `many`, one `enqueue_many`) from the
    committer's answer: its job(s), or its refusal, with the warnings it was accepted with."""
    if isinstance(answer, Refusal):
        return refused(answer).json()
    if many:
        reply: dict[str, Any] = {"ok": True, "job_ids": [s.job_id for s in answer]}
        dups = [s.job_id for s in answer if s.duplicate]
        if dups:
            reply["duplicates"] = dups
    else:
        s = answer[0]
        reply = {"ok": True, "job_id": s.job_id, "state": s.state}
        if s.duplicate:
            reply["duplicate"] = True
    if warnings:  # additive: a client that does not know the field ignores it
        reply["warnings"] = warnings
    return reply

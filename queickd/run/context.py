"""What a running step function may ask about its own job: `workflow_key()`.

Owns one context variable, set by a runner around the call of a workflow step's job and
reset after it; it never touches the store. Read from the thread (or context) that runs
the job; elsewhere it is None.
"""

from __future__ import annotations

import contextvars

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("queickd_workflow_key", default=None)


def workflow_key() -> str | None:
    """The idempotency key `wf:RUN:STEP:ITEM[:LOOP]` of the workflow step job being run
    here (the same on every attempt of that job), or None outside a workflow step. Use it
    to make the step's own side effects idempotent: steps run at least once."""
    return _KEY.get()


def set_key(key: str | None) -> contextvars.Token:
    return _KEY.set(key)


def reset(token: contextvars.Token) -> None:
    _KEY.reset(token)

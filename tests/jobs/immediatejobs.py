"""Job functions the immediate-mode tests enqueue: they run in the test's own process, so
they keep what happened in module state (the tests clear it)."""

RUNS: dict[str, int] = {}  # runs so far, by name
LOG: list[str] = []  # what the jobs did, in order
QUEUE = None  # the immediate queue a job enqueues through (set by the test)


def flaky(name, failures):
    """Fails its first `failures` runs; then returns how many runs it took."""
    n = RUNS[name] = RUNS.get(name, 0) + 1
    if n <= failures:
        raise ConnectionError(f"{name}: run {n} fails on purpose")
    return n


def record(token):
    LOG.append(token)
    return token


def enqueue_behind_me(key):
    """A job of serial key `key` that enqueues another job of the same key while it runs,
    then tries to add a manual one; returns the second job's id and the manual one's error."""
    LOG.append("first starts")
    second = QUEUE.enqueue(record, args=("second",), key=key)
    try:
        QUEUE.enqueue(record, args=("manual",), key=key, manual=True)
        refused = None
    except Exception as e:  # the key has a job running: a manual job is refused `conflict`
        refused = getattr(e, "code", repr(e))
    LOG.append("first ends")
    return [second, refused]


def wait_for_my_child():
    """Enqueues a job and waits for it: it cannot end while this one runs."""
    child = QUEUE.enqueue(record, args=("child",))
    QUEUE.wait(child, timeout=5)


def flaky_step(state):
    """A workflow step that fails its first two runs."""
    return {"runs": flaky("step", 2)}


def report_progress():
    """Reports 1/2, reads its own job through the queue (what `get` shows while it runs),
    then reports 2/2; returns what it read."""
    import queickd

    queickd.progress(1, 2, "half")
    seen = QUEUE.get(queickd.current_job().id)["progress"]
    queickd.progress(2, 2)
    return [seen["done"], seen["total"], seen["note"]]


async def enqueue_from_async(token):
    """An async job that uses the queue as a plain job does: enqueues, and reads itself."""
    import queickd

    child = QUEUE.enqueue(record, args=(token,))
    return [child, QUEUE.get(queickd.current_job().id)["state"]]

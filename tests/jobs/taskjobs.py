"""Job functions declared as tasks. Importing this module opens no connection: the daemon
imports it to run its jobs, and the tests import it, with no daemon at QUEICKD_PORT."""

from queickd import JobQueue

queue = JobQueue()  # where the tests point it: host and port are set per test


@queue.task
def add(a, b):
    return a + b


@queue.task(priority=5, key="reports")
def report(name, *, copies=1):
    return f"{name} x{copies}"


@queue.task(retry=False)
def fail(message="boom"):
    raise ValueError(message)


@queue.task
async def wait_open(name):
    """An async task: waits until the sync job asyncjobs:open_door(name) has run."""
    import asyncjobs

    return await asyncjobs.wait_open(name)

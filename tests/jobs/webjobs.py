"""Job functions for the HTTP, metrics and legacy-client tests (part of the test --app-dir)."""

import gc


def echo(payload):
    """A webhook's job: returns the one argument it was called with."""
    return payload


def record(path, *args):
    """Record one run and its arguments as a line (a Queick client's job)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(repr(args) + "\n")


def stop_scheduler():
    """Stop the daemon's scheduler thread from inside the daemon, through its own stop(),
    so a test can watch /healthz notice a dead scheduler."""
    from queickd.services.scheduler import Scheduler

    gc.unfreeze()  # the daemon froze what it held once started: get_objects does not list that
    schedulers = [o for o in gc.get_objects() if isinstance(o, Scheduler)]
    for s in schedulers:
        s.stop()
    return len(schedulers)

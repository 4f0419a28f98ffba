"""Job functions the benchmarks enqueue. Importable as the top-level module `benchjobs`:
queickd gets this directory as --app-dir, and Queick 1.2.1 (which imports jobs from its
working directory) runs in a temp directory holding a copy of this file."""


def noop():
    """Do nothing: the cost measured is the queue's, not the job's."""
    return None


def append_byte(path):
    """Append one byte to `path`: a visible trace that the job ran."""
    with open(path, "ab") as f:
        f.write(b".")


def append_line(path, line):
    """Append one line (a token) to `path`; one write on an O_APPEND file, so lines from
    concurrent workers never interleave."""
    with open(path, "a") as f:
        f.write(f"{line}\n")


def record_latency(path, sent_at):
    """Append, as one line, the seconds from `sent_at` (the client's time.time() just before
    it sent the job) to now, when the job starts."""
    import time

    started = time.time()
    with open(path, "a") as f:
        f.write(f"{started - sent_at!r}\n")


def append_line_after(path, line, seconds):
    """Work for `seconds` (a sleep), then append `line` like append_line: a job that is
    still running when its worker is killed leaves no line unless it runs again."""
    import time

    time.sleep(seconds)
    append_line(path, line)


def hold(seconds):
    """Run for `seconds` (a sleep): a job that keeps its concurrency group's slot taken."""
    import time

    time.sleep(seconds)


async def asleep(seconds):
    """Await asyncio.sleep(seconds): an async job that holds no thread while it waits."""
    import asyncio

    await asyncio.sleep(seconds)


def report_steps(steps, pause):
    """Call queickd.progress `steps` times (each a new value), `pause` seconds apart: a
    long job that reports as it goes, beside the no-op jobs (bench/progress.py)."""
    import time

    import queickd

    for i in range(steps):
        queickd.progress(i + 1, steps)
        time.sleep(pause)
    return steps


def quiet_steps(steps, pause):
    """report_steps without the reports: the same worker kept busy as long."""
    import time

    for _ in range(steps):
        time.sleep(pause)
    return steps


def report_once():
    """A no-op job that says its progress once."""
    import queickd

    queickd.progress(1, 1)

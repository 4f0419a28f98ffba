"""Job functions the tests enqueue. This directory is the test daemon's --app-dir."""

import socket
import time


def noop():
    return None


def add(a, b):
    return a + b


def fail(message="boom"):
    raise ValueError(message)


def append(path, token):
    """Record that this job ran: one line per run (O_APPEND keeps lines whole)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{token}\n")


def append_time_and_fail(path):
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{time.time()!r}\n")
    raise RuntimeError("failing on purpose")


def gate(port, token):
    """Tell the test this job started (a line on its socket), then block until the test
    answers or closes. Lets a test hold a job running without sleeping."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"{token}\n".encode())
        return s.recv(100).decode().strip()


def refuse_connection():
    raise ConnectionRefusedError(111, "Connection refused")


def big_result(n):
    return "x" * n


def unserializable():
    return object()


def exit_job():
    raise SystemExit(3)


def kwargs_echo(**kwargs):
    return kwargs


def post(port, path, token):
    """Stand-in for a call over the network: connect to a local listener, then record the run."""
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    append(path, token)


def post_to(host, port, path, token):
    with socket.create_connection((host, port), timeout=2):
        pass
    append(path, token)


def fail_surrogate():
    """Fails with a message holding a lone surrogate, as a file name read with
    surrogateescape would give."""
    raise RuntimeError("bad file name: " + b"caf\xe9".decode("utf-8", "surrogateescape"))


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("cannot print myself")


def fail_unprintable():
    raise _UnprintableError()


def span(path, token, hold=0.02):
    """Record one run: token, the worker's pid, and when it started and ended (one line,
    written whole), so a test can see which process ran it and whether runs overlapped."""
    import os

    start = time.time()
    time.sleep(hold)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{token} {os.getpid()} {start!r} {time.time()!r}\n")


def nested_result(levels):
    v = [0]
    for _ in range(levels - 1):
        v = [v]
    return v


def fail_while(path):
    """Fails while `path` exists: an outage that ends when the test removes the file."""
    import os

    if os.path.exists(path):
        raise ConnectionError(f"{path} says the service is down")
    return "up"


_HELD = []


def hold_memory(mb):
    """Grow the process by `mb` MB and keep it (touched, so it is resident): a run whose
    RSS growth the in-thread runner can see."""
    block = bytearray(mb * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _HELD.append(block)
    return len(_HELD)


def raise_emfile():
    """Fail as a job does when the process has no file descriptor left."""
    import errno
    import os

    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def open_files(n):
    """Open n files at once (a job that needs file descriptors), close them; returns n."""
    import os

    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]
    for fd in fds:
        os.close(fd)
    return n


def my_tick():
    """The tick the cron run calling this was fired for (queickd.cron_tick())."""
    import queickd

    return queickd.cron_tick()


def my_ticks_after_gate(port, token):
    """Held by the test's gate first; then the cron run's first and last ticks."""
    import queickd

    gate(port, token)
    return [queickd.cron_tick(), queickd.cron_last_tick()]



def _announce(port, token):
    """Tell the test's Gate this job started (one line), without waiting for an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"{token}\n".encode())


def python_loop(port, path, seconds=60.0):
    """Announce itself to the Gate at `port`, then run Python code (short sleeps) for up to
    `seconds`: what an interruption in the job's thread stops between two sleeps. Appends
    what interrupted it to `path`, and raises it on."""
    _announce(port, "looping")
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(0.01)
    except BaseException as e:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"interrupted {type(e).__name__}\n")
        raise
    return "ran to its end"


def stubborn(port, path, seconds=60.0):
    """Like python_loop, but swallows the first interruption and loops on: only a second
    one stops it."""
    try:
        return python_loop(port, path, seconds)
    except BaseException:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.01)
        return "swallowed it"


def until_cancelled(port, path, seconds=60.0):
    """Checks queickd.current_job().cancelled between steps and stops cleanly, writing what
    it saw to `path`; the interruption that also comes is caught, so the check decides."""
    import queickd

    me = queickd.current_job()
    _announce(port, "checking")
    end = time.monotonic() + seconds
    wrote = False  # an interruption landing after the line is written must not write it again
    while time.monotonic() < end:
        try:
            if me.cancelled:
                if not wrote:
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(f"job {me.id} attempt {me.attempt} saw cancelled\n")
                    wrote = True
                return "stopped cleanly"
            time.sleep(0.01)
        except queickd.JobInterrupted:
            continue
    return "ran to its end"


def current():
    """What queickd.current_job() says inside the job: id, attempt, deadline, cancelled."""
    import queickd

    me = queickd.current_job()
    return None if me is None else [me.id, me.attempt, me.deadline, me.cancelled]


def spin_for(seconds):
    """Python code (no blocking call) for `seconds`; returns how many turns it made."""
    end, turns = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        turns += 1
    return turns


def refused_once(path, retry_after):
    """Refused for its rate on its first run (as by an HTTP 429), then done."""
    import os

    from queickd import RateLimited

    if not os.path.exists(path):
        open(path, "w").close()
        raise RateLimited(retry_after=retry_after)
    return "posted"

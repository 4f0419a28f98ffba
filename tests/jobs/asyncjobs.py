"""Jobs written as coroutines (async def), and plain functions that return awaitables."""

import asyncio
import threading

import queickd


async def aadd(a, b):
    await asyncio.sleep(0)
    return a + b


def returns_a_coroutine(a, b):
    """A plain def whose call returns an awaitable: only its run can tell."""
    return aadd(a, b)


async def gives_a_coroutine(a, b):
    """An async def whose awaited value is itself a coroutine: that one is awaited too."""
    return aadd(a, b)


async def asleep(seconds):
    await asyncio.sleep(seconds)
    return seconds


async def announce_then_sleep(port, path, seconds=600.0):
    """Tell the Gate at `port` it runs (with its current_job().id), then sleep: what a cancel
    or a timeout stops. Appends what stopped it to `path`, and raises it on."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"sleeping {queickd.current_job().id}\n".encode())
    await writer.drain()
    try:
        await asyncio.sleep(seconds)
    except BaseException as e:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"stopped {type(e).__name__} cancelled={queickd.current_job().cancelled}\n")
        raise
    finally:
        writer.close()
    return "slept"


_met: dict[str, int] = {}
_all_here: dict[str, asyncio.Event] = {}


async def meet(name, count):
    """Return once `count` jobs named `name` have all arrived here: each waits for the last.
    A job that waits a minute in vain fails (TimeoutError): they did not run at once."""
    _met[name] = _met.get(name, 0) + 1
    here = _all_here.setdefault(name, asyncio.Event())
    if _met[name] >= count:
        here.set()
    await asyncio.wait_for(here.wait(), 60)
    return _met[name]


_doors = threading.Lock()
_waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
_opened: set[str] = set()


async def wait_open(name):
    """Wait until the sync job open_door(name) has run."""
    with _doors:
        if name in _opened:
            return "through"
        door = _waiting.setdefault(name, (asyncio.get_running_loop(), asyncio.Event()))[1]
    await asyncio.wait_for(door.wait(), 60)
    return "through"


def open_door(name):
    """A sync job: opens the door wait_open(name) jobs wait at (on their loop)."""
    with _doors:
        _opened.add(name)
        waiting = _waiting.get(name)
    if waiting is not None:
        waiting[0].call_soon_threadsafe(waiting[1].set)
    return "opened"


def returns_a_long_sleep():
    """A plain def whose awaitable outlasts any timeout a test gives it."""
    return asyncio.sleep(600)

"""A module whose import blocks on the test's Gate (its port in QUEICKD_TEST_IMPORT_GATE):
holds a claimed job between its claim and its call, as a slow import does."""

import asyncio
import os
import time

import testjobs

if os.environ.get("QUEICKD_TEST_IMPORT_GATE"):
    testjobs.gate(int(os.environ["QUEICKD_TEST_IMPORT_GATE"]), "importing")


def loop(path, seconds=60.0):
    """Python code (short sleeps) for up to `seconds`; what interrupted it goes to `path`."""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            time.sleep(0.01)
    except BaseException as e:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"interrupted {type(e).__name__}\n")
        raise
    return "ran to its end"


async def aloop(path, seconds=60.0):
    """An async def that sleeps for up to `seconds`; what stopped it goes to `path`."""
    try:
        await asyncio.sleep(seconds)
    except BaseException as e:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"stopped {type(e).__name__}\n")
        raise
    return "ran to its end"

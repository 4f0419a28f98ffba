"""A fork bomb inside the cgroups named on the command line, under a reaper outside them.

`python3 forkbomb.py GROUP...`: this process becomes the subreaper of what it starts and
forks the bomb's first process, which joins the groups, writes "in" on stdout and forks
for ever, each child in a session of its own and forking too (a refused fork is tried
again). The reaper reaps them all as they die, and exits when none is left: nothing is
left to a pid 1 that may not reap."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def bomb(groups: list[str]) -> None:
    for group in groups:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    os.write(1, b"in\n")
    while True:
        try:
            if os.fork() == 0:
                os.setsid()
        except OSError:  # pids.max
            pass


if __name__ == "__main__":
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("cannot become a subreaper")
    if os.fork() == 0:
        try:
            bomb(sys.argv[1:])
        finally:
            os._exit(1)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break

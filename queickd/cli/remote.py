"""Runs a client command against a daemon: connects (with the token file), calls the
command, and turns what can go wrong on the way into an exit status (1: refused or not
reachable) and one line on stderr instead of a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .. import tokenfile
from ..client import JobQueue
from ..clientwire import RequestLostError
from ..core.protocol import QueueError

ClientCommand = Callable[[argparse.Namespace, JobQueue], int]


def connect(a: argparse.Namespace) -> JobQueue:
    token = None
    if a.token_file:
        try:
            token = tokenfile.first_token(a.token_file)
        except ValueError as e:
            raise OSError(str(e)) from None
    return JobQueue(a.host, a.port, token=token, tls=getattr(a, "tls_ca", None))


def run_client(command: ClientCommand, a: argparse.Namespace) -> int:
    """Connect and run `command`; the exit status it returns, or 1 if the daemon refused or
    could not be reached."""
    q = None
    try:
        with connect(a) as q:
            return command(a, q)
    except BrokenPipeError:  # `queick jobs | head`: the reader has gone; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except QueueError as e:
        print(f"queick: {e}", file=sys.stderr)
        return 1
    except (ConnectionError, TimeoutError, OSError) as e:
        if q is not None and q.server_info is None and isinstance(e, RequestLostError) \
                and isinstance(e.__cause__, ValueError):  # its answer to hello was not a reply line
            print(f"queick: {a.host}:{a.port} does not speak queickd's protocol (its answer to hello "
                  f"is not a JSON object); is that the daemon's TCP port (--port), not its HTTP one?", file=sys.stderr)
            return 1
        print(f"queick: {e}", file=sys.stderr)
        return 1

"""`queick`: run the daemon (the default, as Queick did) or talk to a running one.

Every flag can also come from the environment: --some-flag reads QUEICKD_SOME_FLAG.
Exit status: 0 success; 1 the daemon refused or could not be reached; 2 bad usage;
78 (EX_CONFIG) a configuration error at start-up, which systemd should not restart;
79 (EX_VERSION) this queickd's version differs from the shared database's: not restarted either.
`main` only parses (cli/parser.py) and dispatches to the command's handler.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .. import config as config_file
from .options import EX_CONFIG, duration
from .parser import build_parser, parse_args

__all__ = ["EX_CONFIG", "build_parser", "duration", "main", "parse_args"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["attendance"]:
        from ..attendance.cli import main as attendance_main
        return attendance_main(args[1:])
    try:
        a = parse_args(args)
    except config_file.ConfigFileError as e:
        print(f"queick: configuration error: {e}", file=sys.stderr)
        return EX_CONFIG
    return a.handler(a)

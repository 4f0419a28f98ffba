"""Queick 1.2.1's own daemon flags, accepted by `queick run` (and `queick` alone) as aliases,
so a Queick command line works unchanged: `-debug`, `--ping-host HOST` with `--ping-port
PORT`, and `--log-filepath FILE`. Adds them to a parser and folds them into queickd's own
settings after parsing; never reads the environment (they have no QUEICKD_* variable).
"""

from __future__ import annotations

import argparse


def add(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Queick 1.2.1 aliases", "Queick's own flags, accepted so its command "
                             "lines work unchanged")
    g.add_argument("-debug", dest="queick_debug", action="store_true", default=False,
                   help="as --log-level debug")
    g.add_argument("--ping-port", dest="ping_port", type=int, metavar="PORT", default=None,
                   help="the port of --ping-host (as --ping-host HOST:PORT; alone it does nothing, as in Queick)")
    g.add_argument("--log-filepath", dest="log_filepath", metavar="FILE", default=None,
                   help="also append the log to FILE")


def apply(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Fold the aliases given into queickd's settings (a usage error, exit 2, for a port
    given twice or to an ICMP target)."""
    if getattr(a, "queick_debug", False):
        a.log_level = "debug"
    port = getattr(a, "ping_port", None)
    if port is None or a.ping_host is None:
        return
    target = a.ping_host
    bare = target[len("tcp://"):] if target.startswith("tcp://") else target
    if target.startswith("icmp://") or (bare.startswith("[") and "]:" in bare) or bare.count(":") == 1:
        p.error(f"--ping-port {port}: --ping-host {target} names its port already, or is not a TCP target")
    if not 0 < port < 65536:
        p.error(f"--ping-port {port} is not a TCP port")
    a.ping_host = f"[{bare}]:{port}" if ":" in bare and not bare.startswith("[") else f"{bare}:{port}"

"""The token file (`--token-file`): who may use the TCP port. One `name:token` per line, so
one device's token can be revoked (its line removed, then SIGHUP) without touching the
others; a file holding one bare token (no name) keeps working, under the name `default`.
Blank lines and lines starting with '#' are skipped.

Read by the daemon (at start and on SIGHUP: api/tokens.py) and by the client commands
(`--token-file`: the file's first token). Parses and reads only; never logs a token, and
no message it raises holds one.
"""

from __future__ import annotations

import re

BARE = "default"  # the name of a file's one bare token
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def parse(text: str, path: str) -> dict[str, str]:
    """{token: name} of a token file's text, in the file's order. Raises ValueError naming
    the file and line of a token that cannot be told apart (no name, a name or token twice)."""
    lines = [(n, s) for n, line in enumerate(text.splitlines(), 1) if (s := line.strip()) and not s.startswith("#")]
    if not lines:
        raise ValueError(f"token file {path} is empty")
    out: dict[str, str] = {}
    for n, line in lines:
        name, sep, token = (part.strip() for part in line.partition(":"))
        if not sep or not NAME.fullmatch(name):
            if len(lines) > 1:
                raise ValueError(f"token file {path} line {n}: give each token a name: one name:token "
                                 "per line (names: letters, digits, _ . @ -)")
            name, token = BARE, line
        if not token:
            raise ValueError(f"token file {path} line {n}: no token after '{name}:'")
        if name in out.values():
            raise ValueError(f"token file {path} line {n}: the name {name} is given twice")
        if token in out:
            raise ValueError(f"token file {path} line {n}: the same token as {out[token]}'s; give each its own")
        out[token] = name
    if len(lines) == 1 and lines[0][1] not in out:
        # A lone line `a:b` was a bare token that holds a colon before names existed: it still is.
        out[lines[0][1]] = next(iter(out.values()))
    return out


def read(path: str) -> dict[str, str]:
    """{token: name} of the file at `path`; ValueError if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:  # a missing token file does not appear by restarting: EX_CONFIG
        raise ValueError(f"cannot read token file {path}: {getattr(e, 'strerror', None) or e}") from None
    return parse(text, path)


def first_token(path: str) -> str:
    """The token a client sends from the file at `path`: its first (a device's file holds one)."""
    return next(iter(read(path)))

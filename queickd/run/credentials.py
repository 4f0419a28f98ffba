"""The systemd credentials a function's table passes on to its process jobs
(`[functions."module:func"] credentials = [...]`): where they are found, the start-up check
that each one named is there, and the copy into one job's own directory.

They are found only in the daemon's $CREDENTIALS_DIRECTORY, which systemd fills from the
unit's `LoadCredential=` lines when it starts the service and which stays as it is for the
life of the process. A credential missing at start therefore stays missing until a
restart: `check` refuses it then (the daemon exits 78 naming it), so no job is found
dead for it one by one. Never reads a credential's content except to copy it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

ENV = "CREDENTIALS_DIRECTORY"  # set by systemd for a unit with LoadCredential=


def missing(name: str) -> str | None:
    """None if the credential `name` is among the daemon's; else why not, with what to do."""
    source = os.environ.get(ENV)
    if source is None:
        return (f"credential {name!r} is not among the daemon's systemd credentials: ${ENV} is not set "
                f"(run it under systemd with LoadCredential={name}:/path/to/the/secret in the unit)")
    if not os.path.isfile(os.path.join(source, name)):
        return (f"credential {name!r} is not among the daemon's systemd credentials: no such file in "
                f"${ENV} ({source}); add LoadCredential={name}:/path/to/the/secret to the unit")
    return None


def check(functions: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise ValueError naming the first function table's credential that is not there."""
    for func, spec in functions.items():
        for name in spec.get("credentials", ()):
            why = missing(name)
            if why is not None:
                raise ValueError(f'functions."{func}": {why}')


def copy(job_dir: str, names: Sequence[str]) -> str | None:
    """The credentials `names`, copied into the job's own directory (returned; None for
    none): the child never sees the daemon's credentials directory. FileNotFoundError for
    one that went away since the start-up check."""
    if not names:
        return None
    dest = os.path.join(job_dir, ".credentials")
    os.mkdir(dest, 0o700)
    for name in names:
        why = missing(name)
        if why is not None:
            raise FileNotFoundError(why)
        shutil.copyfile(os.path.join(os.environ[ENV], name), os.path.join(dest, name))
    return dest

"""The feedback command: run on every tap so the person knows whether it counted.

`--feedback 'CMD ARGS'` runs `CMD ARGS RESULT` where RESULT is `in`, `out`, `unknown`,
`ignored` or `error` (the tap could not be logged), with QUEICK_TAP_RESULT, QUEICK_TAP_CARD and QUEICK_TAP_NAME in its
environment (a beep, an LED through GPIO). It runs beside the terminal, never in its
way: a slow or failing command is logged, and killed after `timeout` seconds.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import threading

from .punchlog import IGNORED, Tap

log = logging.getLogger("queickd.attendance.feedback")


def tap_result(tap: Tap) -> str:
    if tap.outcome == IGNORED:
        return "ignored"
    return "unknown" if tap.reason == "unknown card" else tap.reason


class Feedback:
    def __init__(self, command: str | None, timeout: float = 10.0) -> None:
        self.argv = shlex.split(command) if command else []
        self.timeout = timeout

    def __call__(self, tap: Tap) -> None:
        self._start(tap_result(tap), tap.card_id, tap.name)

    def error(self, card_id: str) -> None:
        """The tap could not be logged (a full or broken disk): it did not count."""
        self._start("error", card_id, None)

    def _start(self, result: str, card_id: str, name: str | None) -> None:
        if not self.argv:
            return
        env = {**os.environ, "QUEICK_TAP_RESULT": result, "QUEICK_TAP_CARD": card_id,
               "QUEICK_TAP_NAME": name or ""}
        threading.Thread(target=self._run, args=([*self.argv, result], env), name="attendance-feedback",
                         daemon=True).start()

    def _run(self, argv: list[str], env: dict[str, str]) -> None:
        try:
            r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("feedback command %s failed: %s", argv[0], e)
            return
        if r.returncode != 0:
            log.warning("feedback command %s exited with %d: %s", argv[0], r.returncode,
                        r.stderr.decode(errors="replace").strip()[:200])
        else:
            log.debug("feedback command %s done: %s", argv[0], argv[-1])

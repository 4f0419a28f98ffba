"""docker/Dockerfile: its HEALTHCHECK command, run as the container would run it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).parent.parent / "docker" / "Dockerfile"


def _healthcheck(env: dict) -> subprocess.CompletedProcess:
    cmd = json.loads(re.search(r"^HEALTHCHECK .* CMD (\[.*\])$", DOCKERFILE.read_text(), re.M).group(1))
    assert cmd[0] == "queick"
    return subprocess.run([sys.executable, "-m", "queickd", *cmd[1:]], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_the_healthcheck_passes_against_a_daemon_that_requires_a_token(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    d = start_daemon(None, "--token-file", str(token))
    r = _healthcheck({"QUEICKD_PORT": str(d.port), "QUEICKD_TOKEN_FILE": str(token)})
    assert r.returncode == 0, r.stderr


def test_the_healthcheck_fails_when_the_daemon_does_not_answer(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    d = start_daemon(None, "--token-file", str(token))
    port = d.port
    d.terminate()
    r = _healthcheck({"QUEICKD_PORT": str(port), "QUEICKD_TOKEN_FILE": str(token)})
    assert r.returncode == 1 and "Traceback" not in r.stderr

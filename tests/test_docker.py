"""docker/Dockerfile and docker/docker-compose.yml: their healthcheck commands, run as the
containers would run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

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


# --- docker/docker-compose.yml: each service's healthcheck, run as its container would ------
# No docker here: each service's own healthcheck command runs through the CLI with the
# environment its container has (the image's ENV, then the service's), against a real
# daemon and real workers on a PostgreSQL database of the test's own. The container's paths
# and addresses are mapped to the test's: the database URL, the job directory, the secret
# file; the daemon's port (9999 in the container) is the test daemon's free port.
DOCKER = DOCKERFILE.parent


def _compose() -> dict:
    yaml = pytest.importorskip("yaml", reason="reading docker-compose.yml needs PyYAML")
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _image_env() -> dict[str, str]:
    block = re.search(r"^ENV ((?:.*\\\n)*.*)$", DOCKERFILE.read_text(), re.M).group(1)
    return dict(pair.split("=", 1) for pair in block.replace("\\\n", " ").split())


def _container_env(service: dict, url: str, port: int) -> dict[str, str]:
    env = {**_image_env(), **service.get("environment", {})}
    here = {"/jobs": str(DOCKER / "jobs"), "/run/secrets/queickd_token": str(DOCKER / "fleet-token.example")}
    env = {k: url if k == "QUEICKD_STORE" else here.get(v, v) for k, v in env.items()}
    pg = urlsplit(url)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("QUEICKD_", "PG"))}
    return {**base, **env, "QUEICKD_PORT": str(port), "PGHOST": pg.hostname or "127.0.0.1",
            "PGPORT": str(pg.port or 5432)}


def _run_healthcheck(service: dict, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The service's own healthcheck, else the image's (what Docker runs for it), as the container runs it."""
    image = ["CMD", *json.loads(re.search(r"^HEALTHCHECK .* CMD (\[.*\])$", DOCKERFILE.read_text(), re.M).group(1))]
    kind, *cmd = service.get("healthcheck", {}).get("test", image)
    assert kind in ("CMD", "CMD-SHELL"), kind
    if kind == "CMD-SHELL":
        cmd = ["sh", "-c", cmd[0]]
    if cmd[0] == "queick":
        cmd = [sys.executable, "-m", "queickd", *cmd[1:]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def fleet_daemon(pg_fresh_database, start_daemon):
    """The compose file's `queickd` service: `queick run --workers 0` requiring the token."""
    return start_daemon(pg_fresh_database, "--token-file", str(DOCKER / "fleet-token.example"),
                        "--app-dir", str(DOCKER / "jobs"), workers=0)


def test_every_compose_service_has_a_healthcheck_that_passes(pg_fresh_database, fleet_daemon, start_worker):
    if shutil.which("pg_isready") is None:
        pytest.skip("pg_isready (the postgres service's healthcheck) is not installed")
    services = _compose()["services"]
    start_worker(pg_fresh_database, "default")
    start_worker(pg_fresh_database, "gpu")
    assert sorted(services) == ["postgres", "queickd", "worker-default", "worker-gpu"]
    for name, service in services.items():
        r = _run_healthcheck(service, _container_env(service, pg_fresh_database, fleet_daemon.port))
        assert r.returncode == 0, (name, r.stdout, r.stderr)


def test_a_workers_healthcheck_fails_when_no_worker_of_its_pool_beats_here(pg_fresh_database, fleet_daemon,
                                                                          start_worker):
    services = _compose()["services"]
    gpu = start_worker(pg_fresh_database, "gpu")
    env = {name: _container_env(services[name], pg_fresh_database, fleet_daemon.port)
           for name in ("worker-default", "worker-gpu")}
    other = _run_healthcheck(services["worker-default"], env["worker-default"])  # only the gpu worker runs
    assert other.returncode == 1 and "no worker process of this host" in other.stderr, other.stderr
    assert _run_healthcheck(services["worker-gpu"], env["worker-gpu"]).returncode == 0
    gpu.proc.kill()  # its record stays, beating as far as the database knows, for 3 heartbeats
    gpu.proc.wait(20)
    gone = _run_healthcheck(services["worker-gpu"], env["worker-gpu"])
    assert gone.returncode == 1 and "serving gpu" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr


def test_a_workers_healthcheck_fails_without_a_traceback_when_the_database_is_unreachable(tmp_path):
    service = _compose()["services"]["worker-gpu"]
    env = _container_env(service, "postgresql://queickd@127.0.0.1:1/queickd", 9)
    r = _run_healthcheck(service, env)
    assert r.returncode == 1 and "cannot read the worker registry" in r.stderr and "Traceback" not in r.stderr

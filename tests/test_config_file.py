"""`--config queickd.toml`: every flag can live in the file; env and flags win over it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from queickd.cli import EX_CONFIG, parse_args
from queickd.config import ConfigFileError


def write(tmp_path, text):
    path = tmp_path / "queickd.toml"
    path.write_text(text)
    return str(path)


def test_file_settings_become_the_daemons_settings(tmp_path):
    path = write(tmp_path, 'workers = 7\nmax-queued-per-key = 3\nkeep_finished = "2d"\n'
                 'allow = ["myapp.*"]\naccept-queick-clients = true\nhttp = "127.0.0.1:9000"\n'
                 'log-level = "warning"\n[hooks.gh]\nfunc = "app:handle"\n')
    a = parse_args(["--config", path])
    assert (a.workers, a.max_queued_per_key, a.keep_finished) == (7, 3, 2 * 86400)
    assert a.allow == ["myapp.*"]
    assert a.accept_queick_clients is True
    assert a.http == "127.0.0.1:9000"
    assert a.log_level == "warning"
    assert a.hooks == {"gh": {"func": "app:handle"}}


def test_a_flag_on_the_command_line_wins_over_the_file(tmp_path):
    path = write(tmp_path, "workers = 7\nport = 1234\n")
    a = parse_args(["run", "--config", path, "--workers", "2"])
    assert (a.workers, a.port) == (2, 1234)


def test_the_environment_wins_over_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEICKD_WORKERS", "5")
    a = parse_args(["--config", write(tmp_path, "workers = 7\n")])
    assert a.workers == 5


def test_the_file_can_be_named_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEICKD_CONFIG", write(tmp_path, "workers = 6\n"))
    assert parse_args(["run"]).workers == 6


@pytest.mark.parametrize("text, message", [
    ("wokers = 7\n", "unknown setting 'wokers'"),
    ("workers = \"many\"\n", "workers"),
    ("durability = \"sometimes\"\n", "durability must be one of"),
    ("workers = [\n", "not valid TOML"),
])
def test_a_bad_file_is_a_configuration_error_naming_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigFileError, match=message):
        parse_args(["--config", write(tmp_path, text)])


def test_daemon_exits_78_on_a_bad_config_file(tmp_path):
    path = write(tmp_path, "wokers = 7\n")
    r = subprocess.run([sys.executable, "-m", "queickd", "--config", path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EX_CONFIG
    assert "unknown setting 'wokers'" in r.stderr


def test_daemon_exits_78_on_a_hook_it_could_never_run(tmp_path):
    path = write(tmp_path, f'store = "memory://"\nport = 0\napp-dir = "{tmp_path}"\n'
                 '[hooks.x]\nfunc = "os:system"\n')
    r = subprocess.run([sys.executable, "-m", "queickd", "--config", path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == EX_CONFIG
    assert "os:system is not allowed" in r.stderr


def test_pools_and_heartbeat_can_live_in_the_file(tmp_path):
    a = parse_args(["--config", write(tmp_path, 'pool = ["gpu", "cpu"]\nheartbeat = 2.5\n')])
    assert (a.pool, a.heartbeat) == (["gpu", "cpu"], 2.5)


def test_one_pool_in_the_file_may_be_a_plain_string(tmp_path):
    assert parse_args(["--config", write(tmp_path, 'pool = "gpu"\n')]).pool == ["gpu"]


def test_pools_on_the_command_line_replace_those_of_the_file(tmp_path):
    path = write(tmp_path, 'pool = ["gpu", "cpu"]\n')
    assert parse_args(["run", "--config", path, "--pool", "a", "--pool", "b"]).pool == ["a", "b"]


def test_pools_and_heartbeat_come_from_the_environment_over_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("QUEICKD_POOL", "a,b")
    monkeypatch.setenv("QUEICKD_HEARTBEAT", "4")
    a = parse_args(["--config", write(tmp_path, 'pool = "gpu"\nheartbeat = 2.5\n')])
    assert (a.pool, a.heartbeat) == (["a", "b"], 4.0)
    assert parse_args(["run", "--pool", "z"]).pool == ["z"]  # and the command line over both


def test_a_daemon_serves_the_pool_its_file_names(start_daemon, tmp_path):
    d = start_daemon("memory://", "--config", write(tmp_path, 'pool = "gpu"\n'), workers=2)
    with d.client() as q:
        assert q.stats()["pools"] == {"gpu": {"waiting": 0, "workers": 2}}


# --- a configuration error says where the bad value came from ------------------------------
def _refused(argv, tmp_path, store=None, **env):
    store = store or f"sqlite:///{tmp_path / 'q.db'}"
    r = subprocess.run([sys.executable, "-m", "queickd", *argv, "--store", store],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in {**os.environ, **env}.items() if not k.startswith("QUEICKD_") or k in env})
    assert r.returncode == EX_CONFIG, r.stderr
    return r.stderr.strip().splitlines()[-1]


def test_a_bad_value_from_a_flag_is_named_with_its_flag(tmp_path):
    assert _refused(["run", "--workers", "-1"], tmp_path) == \
        "queick: configuration error: workers must be 0 or more (workers = -1 from the flag --workers)"


def test_an_abbreviated_flag_is_named_by_its_whole_name(tmp_path):
    assert _refused(["run", "--worke", "-1"], tmp_path).endswith("(workers = -1 from the flag --workers)")


def test_a_bad_value_from_the_environment_is_named_with_its_variable(tmp_path):
    assert _refused(["run"], tmp_path, QUEICKD_WORKERS="-1").endswith("(workers = -1 from QUEICKD_WORKERS)")


def test_a_bad_value_from_the_config_file_is_named_with_the_file(tmp_path):
    path = write(tmp_path, "max_queued = 0\n")
    assert _refused(["run", "--config", path], tmp_path).endswith(f"(max_queued = 0 from {path})")


def test_an_external_workers_bad_value_is_named_too(tmp_path):
    # Checked before it connects: no database needs to answer at this address.
    line = _refused(["worker", "--heartbeat", "0"], tmp_path, store="postgresql://127.0.0.1:1/none")
    assert line.endswith("(heartbeat = 0.0 from the flag --heartbeat)")


def test_settings_left_at_their_defaults_are_not_named(tmp_path):
    # The file sets the one bad value; the other settings the message names keep their defaults.
    path = write(tmp_path, "event_max_attempts = 0\n")
    line = _refused(["run", "--config", path], tmp_path)
    assert line.endswith(f"(event_max_attempts = 0 from {path})")
    assert "max_queued =" not in line and "max_queued_per_key =" not in line

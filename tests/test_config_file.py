"""`--config queickd.toml`: every flag can live in the file; env and flags win over it."""

from __future__ import annotations

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

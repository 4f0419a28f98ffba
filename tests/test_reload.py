"""SIGHUP reloads job code in a running daemon: a function added to an imported module
runs without a restart; a module that fails to import on reload keeps its old code, for
thread and process jobs alike; a process job waiting for its zygote as reloads come runs."""

from __future__ import annotations

import re
import signal

import pytest
from test_sandbox_failures import ImportGate

from queickd.core.job import State
from queickd.core.protocol import Code, QueueError

FIRST = "def hello():\n    return 'v1'\n"
SECOND = "def hello():\n    return 'v2'\n\n\ndef added(x):\n    return x * 10\n"
BROKEN = "def hello():\n    return 'v3'\n\nimport nonexistent_module_for_the_reload_test\n"


def _daemon(start_daemon, tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    (app / "reloadjobs.py").write_text(FIRST)
    return app, start_daemon(None, "--app-dir", str(app), workers=1)


def test_sighup_imports_job_modules_afresh(start_daemon, tmp_path):
    app, d = _daemon(start_daemon, tmp_path)
    with d.client() as q:
        assert q.wait(q.enqueue("reloadjobs:hello"), 20)["result"] == "v1"
        (app / "reloadjobs.py").write_text(SECOND)
        with pytest.raises(QueueError) as before:  # not picked up yet: the loaded module lacks it
            q.enqueue("reloadjobs:added", (4,))
        assert before.value.code == Code.NOT_FOUND
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line(r"reload: \d+ module\(s\) imported afresh")
        assert q.wait(q.enqueue("reloadjobs:added", (4,)), 20)["result"] == 40
        assert q.wait(q.enqueue("reloadjobs:hello"), 20)["result"] == "v2"


def test_a_module_that_fails_on_reload_keeps_serving_its_old_code_and_says_why(start_daemon, tmp_path):
    app, d = _daemon(start_daemon, tmp_path)
    with d.client() as q:
        assert q.wait(q.enqueue("reloadjobs:hello"), 20)["result"] == "v1"
        (app / "reloadjobs.py").write_text(BROKEN)
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line("reload: reloadjobs failed to import, the old code keeps serving: "
                        "ModuleNotFoundError")
        assert q.wait(q.enqueue("reloadjobs:hello"), 20)["result"] == "v1"
        assert d.proc.poll() is None  # still serving


def test_sighups_while_the_zygote_starts_for_a_process_job_do_not_fail_it(start_daemon, tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    gate = ImportGate(tmp_path / "g")
    (app / "gated.py").write_text(gate.code)
    config = tmp_path / "q.toml"
    config.write_text('[functions."gated:job"]\ncredentials = []\n')  # preloaded by each zygote
    d = start_daemon(None, "--app-dir", str(app), "--config", str(config), workers=1)
    with d.client() as q:
        job = q.enqueue("gated:job", isolation="process")
        for last in (False, True):  # two reloads, each while the zygote started for the job imports
            held = gate.held()
            d.proc.send_signal(signal.SIGHUP)
            while "re-importing the job modules" not in d._lines_q.get(timeout=20):  # this reload's line
                pass
            if last:
                gate.remove()
            held.close()
        done = q.wait(job, 30)
    assert (done["state"], done["result"], done["attempts"]) == (State.SUCCEEDED, 1, 1)


def test_sighup_leaves_the_config_files_function_settings_until_a_restart_and_says_so(start_daemon, tmp_path):
    config = tmp_path / "q.toml"
    config.write_text('[functions."sandboxjobs:whoami"]\nisolation = "process"\n')
    d = start_daemon(None, "--config", str(config), workers=1)
    with d.client() as q:
        assert q.wait(q.enqueue("sandboxjobs:whoami"), 20)["result"]["pid"] != d.proc.pid
        config.write_text('[functions."sandboxjobs:whoami"]\nisolation = "thread"\n')
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line(rf"reload: {re.escape(str(config))} changed since the daemon started; SIGHUP reloads "
                        r"job code, the token file and the TLS certificate only; the file's settings take effect "
                        r"when the daemon restarts")
        assert q.wait(q.enqueue("sandboxjobs:whoami"), 20)["result"]["pid"] != d.proc.pid  # still a process


def test_sighup_says_nothing_of_a_config_file_left_as_it_was(start_daemon, tmp_path):
    config = tmp_path / "q.toml"
    config.write_text('[functions."sandboxjobs:whoami"]\nisolation = "process"\n')
    d = start_daemon(None, "--config", str(config), workers=1)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_for_line(r"reload: \d+ module\(s\) imported afresh")
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(30)
    d.wait_for_line("stopped")
    assert not any("changed since the daemon started" in line for line in d.lines)


def test_a_module_that_fails_on_reload_keeps_its_old_code_for_process_jobs_too(start_daemon, tmp_path):
    app, d = _daemon(start_daemon, tmp_path)
    with d.client() as q:
        assert q.wait(q.enqueue("reloadjobs:hello", isolation="process"), 20)["result"] == "v1"
        (app / "reloadjobs.py").write_text("def hello(:\n    return 'v3'\n")  # a syntax error
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_line("zygote reload: reloadjobs failed to import, the old code keeps serving: SyntaxError")
        for _ in range(2):  # the file on disk is newer than the import: still the last good code
            job = q.wait(q.enqueue("reloadjobs:hello", isolation="process"), 20)
            assert (job["state"], job["result"]) == (State.SUCCEEDED, "v1"), job


def test_a_module_changed_on_disk_with_a_syntax_error_keeps_its_old_code_for_process_jobs(start_daemon, tmp_path):
    app, d = _daemon(start_daemon, tmp_path)
    with d.client() as q:
        assert q.wait(q.enqueue("reloadjobs:hello", isolation="process"), 20)["result"] == "v1"
        (app / "reloadjobs.py").write_text("def hello(:\n    return 'v3'\n")  # no SIGHUP this time
        job = q.wait(q.enqueue("reloadjobs:hello", isolation="process"), 20)
        assert (job["state"], job["result"]) == (State.SUCCEEDED, "v1"), job
        (app / "reloadjobs.py").write_text(SECOND)  # fixed: the zygote picks it up
        assert q.wait(q.enqueue("reloadjobs:added", (4,), isolation="process"), 20)["result"] == 40

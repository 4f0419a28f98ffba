"""What the Pi install relies on: a stdlib-only core, valid units, a sane install script."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_the_core_imports_only_the_standard_library():
    code = (
        "import sys\n"
        "import queickd, queickd.cli, queickd.daemon, queickd.client, queickd.store.sqlite.store\n"
        "ours = {'queickd', '__main__'}\n"
        "foreign = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - ours)\n"
        "print(','.join(foreign))\n"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    assert out == "", f"the core imported non-stdlib modules: {out}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", sorted((ROOT / "systemd").glob("*.service")), ids=lambda p: p.name)
def test_systemd_units_verify_cleanly(unit, tmp_path):
    # The unit names the venv the install script creates; point it at an executable that
    # exists here so that verify checks everything else.
    text = unit.read_text().replace("/opt/queickd/venv/bin/queick", sys.executable)
    copy = tmp_path / unit.name
    copy.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stderr


def test_the_unit_does_not_restart_on_configuration_errors():
    from queickd.cli import EX_CONFIG

    text = (ROOT / "systemd" / "queickd.service").read_text()
    assert f"RestartPreventExitStatus={EX_CONFIG}" in text and "Type=notify" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_install_script_parses_and_refuses_non_root_use():
    script = ROOT / "scripts" / "install-pi.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() != 0:
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True)
        assert r.returncode == 1 and "run as root" in r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", sorted((ROOT / "systemd").glob("*.service")), ids=lambda p: p.name)
def test_systemd_units_are_rated_ok_by_systemd_analyze_security(unit):
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True)
    if "--offline" in r.stderr:
        pytest.skip("this systemd-analyze has no --offline")
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d)", r.stdout).group(1))
    # 7.6 "EXPOSED" before the sandbox was tightened. The units that run jobs pay about 0.9 for
    # the jobs' namespaces: user, pid and mnt namespaces, @mount, and no ProtectKernelTunables=
    # or ProtectKernelLogs= (see the next test).
    assert score <= (3.0 if unit in _job_running_units() else 2.0), r.stdout


def test_the_job_running_units_let_a_process_job_have_namespaces_of_its_own():
    # Under RestrictNamespaces=yes, or without @mount, or with part of /proc covered by a mount
    # (ProtectKernelTunables=, ProtectKernelLogs=, ProcSubset=, InaccessiblePaths= in /proc),
    # the kernel refuses a job its user, pid and mount namespaces or its own /proc, and the job
    # reads what the daemon's user can (tests/test_unit_sandbox.py shows both).
    for unit in _job_running_units():
        lines = unit.read_text().splitlines()
        assert "RestrictNamespaces=user pid mnt" in lines, unit.name
        assert "SystemCallFilter=@system-service @mount" in lines, unit.name
        assert [x for x in lines if x.startswith("SystemCallFilter=")] == ["SystemCallFilter=@system-service @mount"]
        covering = [x for x in lines if re.match(r"(ProtectKernelTunables|ProtectKernelLogs|ProcSubset)=", x)
                    or re.match(r"(InaccessiblePaths|ReadOnlyPaths|TemporaryFileSystem)=.*/proc", x)]
        assert covering == [], (unit.name, covering)
        for kept in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectKernelModules=yes",
                     "ProtectControlGroups=yes", "ProtectProc=invisible", "RestrictSUIDSGID=yes",
                     "SystemCallArchitectures=native", "PrivateDevices=yes", "PrivateMounts=yes"):
            assert kept in lines, (unit.name, kept)


def test_the_daemon_unit_lets_the_network_checker_send_icmp_and_nothing_more():
    lines = (ROOT / "systemd" / "queickd.service").read_text().splitlines()
    assert "AmbientCapabilities=CAP_NET_RAW" in lines and "CapabilityBoundingSet=CAP_NET_RAW" in lines
    assert "NoNewPrivileges=yes" in lines and "User=queickd" in lines


def _fake_python(version: str, venv: bool) -> Path:
    """A python3 on a PATH of its own (readable by any user) answering the install script's checks."""
    bindir = Path(tempfile.mkdtemp(prefix="fakepy-"))
    bindir.chmod(0o755)
    old = "import sys; sys.exit(sys.version_info < (3, 11))"
    script = bindir / "python3"
    script.write_text("#!/bin/sh\n"
                      f"case \"$2\" in\n  '{old}') exit {0 if tuple(map(int, version.split('.'))) >= (3, 11) else 1} ;;\n"
                      f"  *print*) echo {version} ;;\n  *ensurepip*) exit {0 if venv else 1} ;;\nesac\n")
    script.chmod(0o755)
    return bindir


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("version,venv,message", [
    ("3.9", True, "needs Python 3.11 or newer; this host has 3.9"),
    ("3.11", False, "apt install python3-venv"),
], ids=["old-python", "no-venv"])
def test_the_install_script_checks_python_before_anything_else(version, venv, message):
    bindir = _fake_python(version, venv)
    try:
        # As an unprivileged user where one exists: the check comes before the root check,
        # and such a user could not change the system if it did not.
        who = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] \
            if os.geteuid() == 0 and shutil.which("setpriv") else []
        if os.geteuid() == 0 and not who:
            pytest.skip("running as root without setpriv: the script would install for real")
        # A copy the unprivileged user can read (a checkout may sit in a private directory).
        script = bindir / "install-pi.sh"
        shutil.copy(ROOT / "scripts" / "install-pi.sh", script)
        script.chmod(0o755)
        r = subprocess.run([*who, "bash", str(script)], capture_output=True,
                           text=True, env={**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}, cwd="/")
    finally:
        shutil.rmtree(bindir)
    assert r.returncode == 1 and message in r.stderr and "run as root" not in r.stderr


def test_the_install_script_puts_queick_on_the_path_and_uninstalls_worker_instances():
    text = (ROOT / "scripts" / "install-pi.sh").read_text()
    assert 'ln -sfn "$PREFIX/venv/bin/queick" /usr/local/bin/queick' in text
    assert "systemctl disable --now \"$unit\"" in text and "'queickd-worker@*.service'" in text
    assert "apt-get install -y libpq5" in text and "linux-armv7l" in text


def _job_running_units() -> list[Path]:
    """The units whose ExecStart runs jobs: the daemon (`queick run`) and workers (`queick worker`)."""
    return [u for u in sorted((ROOT / "systemd").glob("*.service"))
            if re.search(r"^ExecStart=\S+/queick (run|worker)\b", u.read_text(), re.M)]


def test_daemon_unit_kills_mixed():
    # SIGTERM to the main process only: a stop or restart must not hit every job's child
    # (and the zygote) at once; the daemon stops them itself within --stop-timeout.
    units = _job_running_units()
    assert [u.name for u in units] == ["queickd-worker@.service", "queickd.service"]
    for unit in units:
        assert "KillMode=mixed" in unit.read_text().splitlines(), unit.name


@pytest.mark.parametrize("unit", ["queickd.service", "queickd-worker@.service", "queickd-attendance.service"])
def test_each_units_documentation_is_a_page_of_the_docs_tree(unit):
    """install-pi.sh installs docs/ as it is into /usr/share/doc/queickd: the page a unit names
    must be in the repository's docs/ (the install itself is tested in test_attendance_packaging)."""
    docs = [line.split("=", 1)[1] for line in (ROOT / "systemd" / unit).read_text().splitlines()
            if line.startswith("Documentation=")]
    assert docs
    for uri in docs:
        assert uri.startswith("file:/usr/share/doc/queickd/"), uri
        page = uri.removeprefix("file:/usr/share/doc/queickd/")
        assert (ROOT / "docs" / page).is_file(), uri


def test_the_package_metadata_names_the_docs_as_they_are_in_the_repository():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    urls = {k.strip(): v.strip() for k, v in
            (line.split("=", 1) for line in cfg["metadata"]["project_urls"].strip().splitlines())}
    page = urls["Documentation"]
    assert (ROOT / page).is_file(), page
    extras = cfg["options.extras_require"]["docs"]
    for tool in ("mkdocs", "mkdocs-material", "mkdocstrings[python]"):
        assert tool in extras, tool

"""The terminal's Pi packaging: its unit, the daemon's drop-in, the install script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import installroot
import pytest

from queickd.attendance.cli import EX_CONFIG

ROOT = Path(__file__).parent.parent
UNIT = ROOT / "systemd" / "queickd-attendance.service"
DROPIN = ROOT / "systemd" / "queickd.service.d" / "attendance.conf"
needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed (no systemd here)")


def verify(text: str, name: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # The units name the venv the install script creates; point them at an executable
    # that exists here so that verify checks everything else.
    copy = tmp_path / name
    copy.write_text(text.replace("/opt/queickd/venv/bin/queick", sys.executable))
    return subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)


@needs_systemd
def test_the_daemon_unit_with_the_attendance_drop_in_verifies_cleanly(tmp_path):
    unit = (ROOT / "systemd" / "queickd.service").read_text()
    service_lines = DROPIN.read_text().split("[Service]\n", 1)[1]
    merged = unit.replace("[Install]", service_lines + "\n[Install]")  # what systemd does with a drop-in
    r = verify(merged, "queickd.service", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r.stderr


def test_the_terminal_unit_is_notify_hardened_and_can_reach_its_reader():
    text = UNIT.read_text()
    for line in ("Type=notify", "User=queickd", "SupplementaryGroups=dialout plugdev", "StateDirectory=queickd",
                 f"RestartPreventExitStatus={EX_CONFIG}", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "DeviceAllow=char-usb_device rw", "DeviceAllow=char-ttyAMA rw", "WatchdogSec=60"):
        assert line in text.splitlines(), line
    assert "PrivateDevices" not in text.replace("Not PrivateDevices=", "")


def test_the_slack_secret_reaches_the_daemon_as_a_credential():
    text = DROPIN.read_text()
    assert "LoadCredential=slack-token:/etc/queickd/slack-token" in text
    assert "Environment=QUEICKD_ALLOW=queickd.attendance.*" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_the_install_script_knows_the_attendance_parts():
    script = ROOT / "scripts" / "install-pi.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for part in ("--attendance", "--uninstall", "90-queickd-nfc.rules", "usermod -a -G dialout,plugdev",
                 "queickd-attendance.service", "nfc,slack"):
        assert part in text, part
    r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--attendance" in r.stdout
    assert subprocess.run(["bash", str(script), "--bogus"], capture_output=True).returncode == 2


def test_the_udev_rule_gives_the_rc_s380_to_plugdev():
    rule = (ROOT / "scripts" / "pi" / "90-queickd-nfc.rules").read_text()
    assert 'ATTRS{idVendor}=="054c", ATTRS{idProduct}=="06c3", GROUP="plugdev"' in rule


# --- the install script, run for real in a throwaway root (tests/installroot.py) ------------
needs_root = pytest.mark.skipif(installroot.available() is not None, reason=str(installroot.available()))


@needs_root
def test_install_attendance_without_a_slack_token_leaves_the_queue_running(tmp_path):
    root = installroot.InstallRoot(tmp_path / "root")
    r = root.run("--attendance")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "/etc/queickd/slack-token" in r.stderr and "/etc/queickd/slack-webhook" in r.stderr
    assert root.systemctl_calls() == []  # queickd.service neither restarted nor stopped
    assert not root.path("/etc/systemd").exists() and not root.path("/opt/queickd").exists()


@pytest.fixture(scope="module")
def installed_with_a_webhook(tmp_path_factory):
    if installroot.available() is not None:
        pytest.skip(installroot.available())
    root = installroot.InstallRoot(tmp_path_factory.mktemp("pi") / "root")
    root.put("/etc/queickd/slack-webhook", "https://hooks.slack.com/services/T0/B0/x\n")
    return root, root.run("--attendance")


def test_install_attendance_with_a_webhook_restarts_the_daemon_with_that_credential(installed_with_a_webhook):
    root, r = installed_with_a_webhook
    assert r.returncode == 0, r.stdout + r.stderr
    dropin = root.path("/etc/systemd/system/queickd.service.d/attendance.conf").read_text()
    assert "LoadCredential=slack-webhook:/etc/queickd/slack-webhook" in dropin.splitlines()
    assert "LoadCredential=slack-token" not in dropin
    calls = root.systemctl_calls()
    assert "restart queickd.service" in calls and not any(c.startswith("FAILED") for c in calls), calls


def test_every_installed_units_documentation_is_installed_with_it(installed_with_a_webhook):
    root, r = installed_with_a_webhook
    assert r.returncode == 0, r.stdout + r.stderr
    units = sorted(root.path("/etc/systemd/system").glob("*.service"))
    assert len(units) == 3
    for unit in units:
        docs = [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith("Documentation=")]
        assert docs, unit.name
        for uri in docs:
            assert uri.startswith("file:/") and root.path(uri.removeprefix("file:")).is_file(), (unit.name, uri)

"""A throwaway root for running scripts/install-pi.sh for real: this machine's / under an
overlay in a private mount namespace, so that everything the script writes (users, units,
/opt/queickd, /etc/queickd) lands in a directory the test removes.

systemd does not run here, so `systemctl` is a shim on the script's PATH, the one stand-in:
it records each call, and refuses to start or restart queickd.service while a
LoadCredential= of its drop-ins names a file that does not exist, as systemd does ("Failed
to set up credentials"). Needs root, unshare and overlayfs; `available()` says why not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SHIM = r"""#!/bin/sh
echo "$*" >> /queickd-test/systemctl.calls
case "$1" in
  start|restart|enable)
    for unit in "$@"; do
      [ "$unit" = queickd.service ] || continue
      for line in $(cat /etc/systemd/system/queickd.service.d/*.conf 2>/dev/null | sed -n 's/^LoadCredential=//p'); do
        if [ ! -f "${line#*:}" ]; then
          echo "queickd.service: Failed to set up credentials: ${line#*:} is missing" >&2
          echo "FAILED queickd.service" >> /queickd-test/systemctl.calls
          exit 1
        fi
      done
    done ;;
esac
exit 0
"""
_MOUNT = """set -e
mount -t overlay overlay -o lowerdir=/,upperdir="$1/upper",workdir="$1/work" "$1/root"
mount --rbind /dev "$1/root/dev"
mount -t proc proc "$1/root/proc"
mount -t tmpfs tmpfs "$1/root/tmp"
shift
exec chroot "$@"
"""


def available() -> str | None:
    """None if a throwaway root can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (a private mount namespace and chroot)"
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        return "needs unshare and chroot"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


class InstallRoot:
    """One throwaway root under `base`. `run(args)` runs the install script in it; `path(p)`
    is where a file the script wrote inside it is seen from outside (its overlay's upper
    layer: only what the script changed)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        for d in ("upper", "work", "root"):
            (base / d).mkdir(parents=True)
        for d in ("/etc/udev/rules.d", "/etc/modprobe.d"):  # as on any Raspberry Pi OS
            self.path(d).mkdir(parents=True, exist_ok=True)
        test = base / "upper" / "queickd-test"
        (test / "bin").mkdir(parents=True)
        shim = test / "bin" / "systemctl"
        shim.write_text(SHIM)
        shim.chmod(0o755)
        # The source tree as the script expects it (scripts/, systemd/, docs/, the package).
        shutil.copytree(ROOT, test / "src", ignore=shutil.ignore_patterns(
            ".git", "__pycache__", "*.pyc", "tests", "bench", ".pytest_cache", ".ruff_cache", "*.egg-info", "build"))

    def put(self, path: str, text: str, mode: int = 0o600) -> None:
        """A file present in the root before the script runs (a secret, say)."""
        p = self.path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)

    def path(self, path: str) -> Path:
        return self.base / "upper" / path.lstrip("/")

    def systemctl_calls(self) -> list[str]:
        calls = self.path("/queickd-test/systemctl.calls")
        return calls.read_text().splitlines() if calls.exists() else []

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        path = ":".join(["/queickd-test/bin", os.path.dirname(sys.executable),
                         "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, "sh", str(self.base),
               str(self.base / "root"), "env", "-i", f"PATH={path}", "HOME=/root", "LANG=C.UTF-8",
               *[f"{k}={v}" for k, v in os.environ.items() if k.startswith("PIP_")],
               "bash", "/queickd-test/src/scripts/install-pi.sh", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

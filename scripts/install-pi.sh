#!/usr/bin/env bash
# Install queickd as a systemd service on a Raspberry Pi (or any Debian-like host).
#   sudo scripts/install-pi.sh              install or upgrade (idempotent)
#   sudo scripts/install-pi.sh --uninstall  remove the service and the venv (keeps the queue)
# Environment: EXTRAS (pip extras, e.g. "slack,nfc", "postgres"), PREFIX (default /opt/queickd).
# The external-worker unit queickd-worker@.service is installed too but not enabled:
#   systemctl enable --now queickd-worker@gpu   (QUEICKD_STORE in /etc/default/queickd-worker)
set -euo pipefail

PREFIX=${PREFIX:-/opt/queickd}
EXTRAS=${EXTRAS:-}
SRC=$(cd "$(dirname "$0")/.." && pwd)
UNIT=/etc/systemd/system/queickd.service
WORKER_UNIT=/etc/systemd/system/queickd-worker@.service

if [ "$(id -u)" -ne 0 ]; then
  echo "install-pi.sh: run as root (sudo)" >&2
  exit 1
fi

if [ "${1:-}" = "--uninstall" ]; then
  systemctl disable --now queickd.service 2>/dev/null || true
  systemctl stop 'queickd-worker@*.service' 2>/dev/null || true
  rm -f "$UNIT" "$WORKER_UNIT"
  systemctl daemon-reload
  rm -rf "$PREFIX"
  echo "removed the service and $PREFIX; the queue in /var/lib/queickd and the queickd user are kept"
  exit 0
fi

echo "==> user"
id queickd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/queickd --shell /usr/sbin/nologin queickd

echo "==> virtualenv in $PREFIX/venv"
python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet --upgrade pip
spec="$SRC"
[ -n "$EXTRAS" ] && spec="$SRC[$EXTRAS]"
"$PREFIX/venv/bin/pip" install --quiet --upgrade "$spec"

echo "==> job directory /etc/queickd/jobs"
install -d -m 0755 /etc/queickd/jobs

echo "==> systemd unit"
install -m 0644 "$SRC/systemd/queickd.service" "$UNIT"
install -m 0644 "$SRC/systemd/queickd-worker@.service" "$WORKER_UNIT"
systemctl daemon-reload
systemctl enable --now queickd.service
systemctl --no-pager --lines=5 status queickd.service || true
echo "done: put job modules in /etc/queickd/jobs; 'queick stats' talks to the daemon"

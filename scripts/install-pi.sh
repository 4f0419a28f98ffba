#!/usr/bin/env bash
# Install queickd as a systemd service on a Raspberry Pi (or any Debian-like host).
#   sudo scripts/install-pi.sh                 install or upgrade the daemon (idempotent)
#   sudo scripts/install-pi.sh --attendance    also the NFC attendance terminal
#   sudo scripts/install-pi.sh --uninstall     remove the services and the venv (keeps the
#                                              queue, the attendance log, the user, the secrets)
# Environment: EXTRAS (more pip extras, e.g. "postgres"), PREFIX (default /opt/queickd).
#
# The attendance terminal reads /etc/default/queickd-attendance (QUEICKD_ATTENDANCE_READER,
# QUEICKD_ATTENDANCE_SLACK_CHANNEL, ...) and posts with the secret in
# /etc/queickd/slack-token (a bot token) or /etc/queickd/slack-webhook (a webhook URL),
# which the daemon receives as a systemd credential.
#
# The external-worker unit queickd-worker@.service is installed too but not enabled:
#   systemctl enable --now queickd-worker@gpu   (QUEICKD_STORE in /etc/default/queickd-worker)
set -euo pipefail

PREFIX=${PREFIX:-/opt/queickd}
EXTRAS=${EXTRAS:-}
SRC=$(cd "$(dirname "$0")/.." && pwd)
UNITS=/etc/systemd/system
DROPIN=$UNITS/queickd.service.d/attendance.conf
UDEV_RULE=/etc/udev/rules.d/90-queickd-nfc.rules
MODPROBE=/etc/modprobe.d/queickd-nfc.conf

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

ATTENDANCE=0
UNINSTALL=0
for arg in "$@"; do
  case "$arg" in
    --attendance) ATTENDANCE=1 ;;
    --uninstall) UNINSTALL=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-pi.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "install-pi.sh: run as root (sudo)" >&2
  exit 1
fi

if [ "$UNINSTALL" -eq 1 ]; then
  for unit in queickd-attendance.service queickd.service; do
    systemctl disable --now "$unit" 2>/dev/null || true
    rm -f "$UNITS/$unit"
  done
  systemctl stop 'queickd-worker@*.service' 2>/dev/null || true
  rm -f "$UNITS/queickd-worker@.service"
  rm -f "$DROPIN"
  rmdir "$UNITS/queickd.service.d" 2>/dev/null || true
  rm -f "$UDEV_RULE" "$MODPROBE"
  command -v udevadm >/dev/null && udevadm control --reload || true
  systemctl daemon-reload
  rm -rf "$PREFIX"
  echo "removed the services and $PREFIX; kept /var/lib/queickd (queue, attendance log), /etc/queickd and the queickd user"
  exit 0
fi

echo "==> user queickd"
id queickd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/queickd --shell /usr/sbin/nologin queickd
if [ "$ATTENDANCE" -eq 1 ]; then
  for group in dialout plugdev; do
    getent group "$group" >/dev/null || groupadd --system "$group"
  done
  usermod -a -G dialout,plugdev queickd
  EXTRAS=${EXTRAS:+$EXTRAS,}nfc,slack
fi

echo "==> virtualenv in $PREFIX/venv"
[ -x "$PREFIX/venv/bin/python" ] || python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet --upgrade pip
spec="$SRC"
[ -n "$EXTRAS" ] && spec="$SRC[$EXTRAS]"
"$PREFIX/venv/bin/pip" install --quiet --upgrade "$spec"

echo "==> job directory /etc/queickd/jobs"
install -d -m 0755 /etc/queickd/jobs

echo "==> systemd units"
install -m 0644 "$SRC/systemd/queickd.service" "$UNITS/queickd.service"
install -m 0644 "$SRC/systemd/queickd-worker@.service" "$UNITS/queickd-worker@.service"
if [ "$ATTENDANCE" -eq 1 ]; then
  install -m 0644 "$SRC/systemd/queickd-attendance.service" "$UNITS/queickd-attendance.service"
  install -d -m 0755 "$UNITS/queickd.service.d"
  # LoadCredential= fails the service when its file is missing: keep the line for the
  # secret that exists (a webhook URL instead of a token, say).
  if [ -f /etc/queickd/slack-token ] || [ ! -f /etc/queickd/slack-webhook ]; then
    install -m 0644 "$SRC/systemd/queickd.service.d/attendance.conf" "$DROPIN"
  else
    sed 's#^LoadCredential=slack-token:/etc/queickd/slack-token#LoadCredential=slack-webhook:/etc/queickd/slack-webhook#' \
      "$SRC/systemd/queickd.service.d/attendance.conf" > "$DROPIN"
    chmod 0644 "$DROPIN"
  fi

  echo "==> udev rule for the RC-S380, and the kernel's port100 driver kept off it"
  install -m 0644 "$SRC/scripts/pi/90-queickd-nfc.rules" "$UDEV_RULE"
  install -m 0644 "$SRC/scripts/pi/queickd-nfc-modprobe.conf" "$MODPROBE"
  modprobe -r port100 2>/dev/null || true
  if command -v udevadm >/dev/null; then
    udevadm control --reload
    udevadm trigger --subsystem-match=usb --attr-match=idVendor=054c || true
  fi
  if [ ! -f /etc/queickd/slack-token ] && [ ! -f /etc/queickd/slack-webhook ]; then
    echo "note: put the Slack bot token in /etc/queickd/slack-token (mode 0600, root),"
    echo "      or an incoming-webhook URL in /etc/queickd/slack-webhook, then run this again"
  fi
fi
systemctl daemon-reload
systemctl enable --now queickd.service
systemctl restart queickd.service  # an upgrade or a changed drop-in takes effect now
if [ "$ATTENDANCE" -eq 1 ]; then
  if [ -f /etc/default/queickd-attendance ]; then
    systemctl enable --now queickd-attendance.service
    systemctl restart queickd-attendance.service
  else
    systemctl enable queickd-attendance.service
    echo "note: set QUEICKD_ATTENDANCE_READER and QUEICKD_ATTENDANCE_SLACK_CHANNEL in"
    echo "      /etc/default/queickd-attendance, then: systemctl start queickd-attendance"
  fi
fi
systemctl --no-pager --lines=5 status queickd.service || true
echo "done: put job modules in /etc/queickd/jobs; 'queick stats' talks to the daemon"
[ "$ATTENDANCE" -eq 0 ] || echo "      register cards with: sudo -u queickd $PREFIX/venv/bin/queick attendance register --db /var/lib/queickd/attendance.db ..."

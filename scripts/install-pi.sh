#!/usr/bin/env bash
# Install queickd as a systemd service on a Raspberry Pi (or any Debian-like host).
#   sudo scripts/install-pi.sh                 install or upgrade the daemon (idempotent)
#   sudo scripts/install-pi.sh --attendance    also the NFC attendance terminal
#   sudo scripts/install-pi.sh --uninstall     remove the services and the venv (keeps the
#                                              queue, the attendance log, the user, the secrets)
# Environment: EXTRAS (more pip extras, e.g. "postgres"), PREFIX (default /opt/queickd).
# Needs Python 3.11 or newer with venv (Raspberry Pi OS Bookworm: apt install python3-venv;
# Bullseye ships 3.9: upgrade the OS first). `queick` is linked into /usr/local/bin.
# EXTRAS=postgres on 32-bit ARM (no psycopg binary wheel) installs libpq5 and plain psycopg.
#
# The attendance terminal reads /etc/default/queickd-attendance (QUEICKD_ATTENDANCE_READER,
# QUEICKD_ATTENDANCE_SLACK_CHANNEL, ...) and posts with the secret in
# /etc/queickd/slack-token (a bot token) or /etc/queickd/slack-webhook (a webhook URL),
# which the daemon receives as a systemd credential: --attendance refuses, changing
# nothing, until one of them exists.
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
DOCS=/usr/share/doc/queickd  # the units' Documentation=
SLACK_TOKEN=/etc/queickd/slack-token
SLACK_WEBHOOK=/etc/queickd/slack-webhook

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

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

# Before anything else (and before asking for root): say what to install.
if [ "$UNINSTALL" -eq 0 ]; then
  if ! command -v python3 >/dev/null || ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    found=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
    echo "install-pi.sh: queickd needs Python 3.11 or newer; this host has $found." >&2
    echo "  Raspberry Pi OS Bookworm (12) or newer ships 3.11; on Bullseye (3.9) upgrade the OS." >&2
    exit 1
  fi
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "install-pi.sh: Python's venv module is missing: apt install python3-venv" >&2
    exit 1
  fi
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-pi.sh: run as root (sudo)" >&2
  exit 1
fi

# The attendance drop-in hands the Slack secret to queickd.service with LoadCredential=,
# and systemd refuses to start a service whose credential file is missing: installing it
# without the secret would take the queue down. So check before anything changes.
if [ "$UNINSTALL" -eq 0 ] && [ "$ATTENDANCE" -eq 1 ] && [ ! -s "$SLACK_TOKEN" ] && [ ! -s "$SLACK_WEBHOOK" ]; then
  echo "install-pi.sh: --attendance needs the Slack secret first (queickd loads it when it starts):" >&2
  echo "  put the bot token (xoxb-...) in $SLACK_TOKEN, or an incoming-webhook URL in" >&2
  echo "  $SLACK_WEBHOOK (owner root, mode 0600), then run this again. Nothing was changed." >&2
  exit 1
fi

if [ "$UNINSTALL" -eq 1 ]; then
  for unit in queickd-attendance.service queickd.service; do
    systemctl disable --now "$unit" 2>/dev/null || true
    rm -f "$UNITS/$unit"
  done
  # Every enabled or running worker instance (queickd-worker@gpu, ...), then the template.
  for unit in $(systemctl list-units --all --plain --no-legend 'queickd-worker@*.service' 2>/dev/null | awk '{print $1}') \
              $(systemctl list-unit-files --plain --no-legend 'queickd-worker@*.service' 2>/dev/null | awk '$1 != "queickd-worker@.service" {print $1}'); do
    systemctl disable --now "$unit" 2>/dev/null || true
  done
  find "$UNITS" -name 'queickd-worker@*.service' -type l -delete 2>/dev/null || true
  rm -f "$UNITS/queickd-worker@.service"
  rm -f "$DROPIN"
  rmdir "$UNITS/queickd.service.d" 2>/dev/null || true
  rm -f "$UDEV_RULE" "$MODPROBE"
  rm -rf "$DOCS"
  command -v udevadm >/dev/null && udevadm control --reload || true
  systemctl daemon-reload
  rm -rf "$PREFIX"
  [ "$(readlink /usr/local/bin/queick 2>/dev/null)" = "$PREFIX/venv/bin/queick" ] && rm -f /usr/local/bin/queick
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
  # gpio: the terminal's unit names it (GPIO feedback through /dev/gpiochip*).
  getent group gpio >/dev/null || groupadd --system gpio
  usermod -a -G gpio queickd
  EXTRAS=${EXTRAS:+$EXTRAS,}nfc,slack
fi

echo "==> virtualenv in $PREFIX/venv"
[ -x "$PREFIX/venv/bin/python" ] || python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet --upgrade pip
spec="$SRC"
[ -n "$EXTRAS" ] && spec="$SRC[$EXTRAS]"
case ",$EXTRAS," in
  *,postgres,*)
    # psycopg[binary] has no wheel for 32-bit ARM (armv7l, armv6l): there the pure-Python
    # psycopg uses the system's libpq.
    platform=$("$PREFIX/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_platform())')
    if [ "$platform" = linux-armv7l ] || [ "$platform" = linux-armv6l ]; then
      echo "==> no psycopg binary wheel for $platform: libpq5 and plain psycopg"
      apt-get install -y libpq5
      "$PREFIX/venv/bin/pip" install --quiet --upgrade 'psycopg>=3.1'
      spec="$SRC"
      rest=$(echo ",$EXTRAS," | sed 's/,postgres,/,/; s/^,//; s/,$//')
      [ -n "$rest" ] && spec="$SRC[$rest]"
    fi
    ;;
esac
"$PREFIX/venv/bin/pip" install --quiet --upgrade "$spec"
ln -sfn "$PREFIX/venv/bin/queick" /usr/local/bin/queick

echo "==> job directory /etc/queickd/jobs"
install -d -m 0755 /etc/queickd/jobs

echo "==> docs in $DOCS"
install -d -m 0755 "$DOCS"
install -m 0644 "$SRC/README.md" "$DOCS/"
# The docs tree as it is in the repository (tutorials/, how-to/, ...): the units'
# Documentation= names a page in it.
(cd "$SRC/docs" && find . -type f -name '*.md') | while read -r page; do
  install -D -m 0644 "$SRC/docs/$page" "$DOCS/$page"
done

echo "==> systemd units"
install -m 0644 "$SRC/systemd/queickd.service" "$UNITS/queickd.service"
install -m 0644 "$SRC/systemd/queickd-worker@.service" "$UNITS/queickd-worker@.service"
if [ "$ATTENDANCE" -eq 1 ]; then
  install -m 0644 "$SRC/systemd/queickd-attendance.service" "$UNITS/queickd-attendance.service"
  install -d -m 0755 "$UNITS/queickd.service.d"
  # LoadCredential= fails the service when its file is missing: keep the line for the
  # secret that exists (a webhook URL instead of a token, say; one of them does: see above).
  if [ -s "$SLACK_TOKEN" ]; then
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

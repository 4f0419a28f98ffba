"""The post jobs: a punch (or the day's summary) to Slack. They run in the daemon's
workers (`--allow 'queickd.attendance.*'`); the queue does the retrying.

Every Slack answer maps onto what the queue knows how to do:
  - HTTP 429: SlackRateLimitedError with `retry_after` from Retry-After (next try then);
  - HTTP 5xx, timeouts, refused or dropped connections: SlackUnavailableError, a
    ConnectionError, so a job with retry_on_network is parked until the network returns;
  - ok:false with an error retrying cannot fix (invalid_auth, channel_not_found, ...):
    SlackRejectedError, `permanent`, a dead letter at once with Slack's error in it;
  - any other error: SlackError, which follows the job's retry policy.
slack-sdk's own retry handlers are off: a retry inside a job would hold a worker and hide
the outage from the queue.

Secrets never travel in job arguments: a job names a token (or webhook URL) file, or
none, and then reads the systemd credential `slack-token` (or `slack-webhook`) of the
process running it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..fate import is_network_error
from .message import DEFAULT_LATE_AFTER, day_report, punch_text, summary_text
from .punchlog import Punch, PunchLog, work_day

log = logging.getLogger("queickd.attendance.slack")

# ok:false errors that no retry can fix: they need an operator (a token, a channel, an invite).
PERMANENT_ERRORS = frozenset({
    "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "missing_scope",
    "no_permission", "channel_not_found", "not_in_channel", "is_archived", "channel_is_archived",
    "restricted_action", "team_access_not_granted", "ekm_access_denied", "invalid_arguments", "no_text",
    "msg_too_long", "invalid_blocks", "invalid_token", "no_service", "no_service_id", "action_prohibited",
    "posting_to_general_channel_denied", "invalid_payload", "user_not_found",
})
# ok:false errors that are Slack having a bad moment.
UNAVAILABLE_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
TOKEN_CREDENTIAL, WEBHOOK_CREDENTIAL = "slack-token", "slack-webhook"


class SlackError(Exception):
    """Slack refused the post for a reason that may pass: the retry policy decides."""


class SlackRejectedError(SlackError):
    """Slack refused the post for a reason that retrying cannot fix: a dead letter at once."""

    permanent = True


class SlackRateLimitedError(SlackError):
    """HTTP 429: try again after `retry_after` seconds, as Slack asked."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SlackUnavailableError(ConnectionError):
    """Slack (or the way to it) is down: network-class, so the job waits for the network."""


@dataclass(frozen=True)
class SlackTarget:
    """Where and how to post. Holds file paths, never the secrets themselves."""

    channel: str | None = None
    token_file: str | None = None
    webhook_file: str | None = None
    base_url: str | None = None  # Web API base, ends in '/'; tests point it at a local server
    timeout: float = 10.0
    late_after: float = DEFAULT_LATE_AFTER

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlackTarget:
        return cls(**d)

    def validate(self) -> None:
        if self.token_file and self.webhook_file:
            raise ValueError("give a Slack token file or a webhook URL file, not both")
        if self.token_file is not None and not self.channel:
            raise ValueError("posting with a bot token needs a channel (--slack-channel)")
        if self.base_url is not None and not self.base_url.endswith("/"):
            raise ValueError("the Slack base URL must end in '/'")
        for path in (self.token_file, self.webhook_file):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{path} does not exist")


def _secret(path: str | None, credential: str) -> str | None:
    if path is None:
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        path = os.path.join(creds, credential) if creds else None
        if path is None or not os.path.exists(path):
            return None
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read().strip()
    except OSError as e:
        raise SlackRejectedError(f"cannot read the Slack secret in {path}: {e}") from None
    if not secret:
        raise SlackRejectedError(f"the Slack secret file {path} is empty")
    return secret


def _classify(status: int, headers: dict[str, Any], error: str) -> Exception:
    lower = {k.lower(): v for k, v in (headers or {}).items()}
    if status == 429 or error == "ratelimited":
        try:
            after = float(lower.get("retry-after", 1))
        except (TypeError, ValueError):
            after = 1.0
        return SlackRateLimitedError(f"Slack rate limit (HTTP {status}); retry after {after:g} s", after)
    if status >= 500 or error in UNAVAILABLE_ERRORS:
        return SlackUnavailableError(f"Slack is unavailable (HTTP {status}: {error})")
    if error in PERMANENT_ERRORS:
        return SlackRejectedError(f"Slack refused the post: {error} (HTTP {status}); fix the Slack "
                                  "settings, then 'queick retry' the job")
    return SlackError(f"Slack refused the post: {error or 'no error given'} (HTTP {status})")


def send(target: SlackTarget, text: str) -> str | None:
    """Post text; returns the message ts (None through a webhook). Raises the errors above."""
    webhook = _secret(target.webhook_file, WEBHOOK_CREDENTIAL) if target.token_file is None else None
    try:
        if webhook is not None:
            return _send_webhook(webhook, target, text)
        token = _secret(target.token_file, TOKEN_CREDENTIAL)
        if token is None:
            raise SlackRejectedError("no Slack token: give --slack-token-file or --slack-webhook-file, or a "
                                     f"systemd credential named {TOKEN_CREDENTIAL} or {WEBHOOK_CREDENTIAL}")
        if not target.channel:
            raise SlackRejectedError("posting with a bot token needs a channel (--slack-channel)")
        return _send_web_api(token, target, text)
    except (SlackError, SlackUnavailableError):
        raise
    except Exception as e:  # urllib's URLError, timeouts, refused connections, resets
        if is_network_error(e):
            raise SlackUnavailableError(f"Slack is unreachable: {e}") from e
        raise


def _send_web_api(token: str, target: SlackTarget, text: str) -> str | None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    kw: dict[str, Any] = {"base_url": target.base_url} if target.base_url else {}
    client = WebClient(token=token, timeout=int(max(1, target.timeout)), retry_handlers=[], **kw)
    try:
        reply = client.chat_postMessage(channel=target.channel, text=text)
    except SlackApiError as e:
        r = e.response
        raise _classify(r.status_code, dict(r.headers), str(r.get("error", ""))) from None
    return reply.get("ts")


def _send_webhook(url: str, target: SlackTarget, text: str) -> None:
    from slack_sdk.webhook import WebhookClient

    reply = WebhookClient(url, timeout=int(max(1, target.timeout)), retry_handlers=[]).send(text=text)
    if reply.status_code != 200:
        raise _classify(reply.status_code, dict(reply.headers), (reply.body or "").strip())
    return None


def _open_log(db: str | None) -> PunchLog | None:
    if db is None or not os.path.exists(db):
        return None
    return PunchLog(db)


def post_punch(punch: dict[str, Any], slack: dict[str, Any], db: str | None = None) -> dict[str, Any]:
    """The job: post one punch. With `db` (the attendance log), a punch already marked
    posted is not posted again, and a successful post is marked there."""
    p = Punch(**punch)
    target = SlackTarget.from_dict(slack)
    plog = _open_log(db)
    try:
        if plog is not None:
            known = plog.punch(p.punch_id)
            if known is not None and known.posted_at is not None:
                return {"posted": False, "reason": "already posted", "ts": known.slack_ts}
        ts = send(target, punch_text(p, time.time(), target.late_after))
        if plog is not None:
            plog.mark_posted(p.punch_id, ts)
        log.info("punch %s posted (%s %s)", p.punch_id, p.name or p.card_id, p.direction)
        return {"posted": True, "ts": ts}
    finally:
        if plog is not None:
            plog.close()


def post_daily_summary(db: str, slack: dict[str, Any], day_boundary: int | None = None) -> dict[str, Any]:
    """The cron job: post the current work day's hours per person."""
    with PunchLog(db, day_boundary=day_boundary) as plog:
        day = work_day(time.time(), plog.day_boundary)
        text = summary_text(day, day_report(plog.punches(day)))
    ts = send(SlackTarget.from_dict(slack), text)
    return {"posted": True, "ts": ts, "day": day}

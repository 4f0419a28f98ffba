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
the outage from the queue. Nor does a post wait out a rate limit itself: the post jobs carry
a rate limit of their channel (`SlackTarget.rate_key`, about one post a second by default, as
Slack allows), so the queue starts them no faster, and a 429's Retry-After blocks the key on
every worker: the refused post waits in its place, queued, no attempt spent, and the posts
behind it (one serial key: tap order) wait behind it, holding no worker meanwhile.

Secrets never travel in job arguments: a job names a token (or webhook URL) file, or
none, and then reads the systemd credential `slack-token` (or `slack-webhook`) of the
process running it.

Exactly once, through the Web API: a post carries its punch id as message metadata
(event type `queickd_punch`), and the attendance log marks a punch "about to post" before
Slack is called. A post that finds that mark left over (the daemon was killed, or the
connection cut, after the request went out and before its outcome was stored) first looks
for its punch id in the channel with conversations.history, and is not posted again if
Slack has it. That needs the bot scope channels:history (groups:history for a private
channel); without it the post goes ahead with a warning, so the punch is posted at least
once and may appear twice. An incoming webhook cannot be asked what it posted: there, the
same window may post twice.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from ..core.fate import is_network_error
from ..run.context import cron_last_tick, cron_tick
from .message import DEFAULT_LATE_AFTER, day_report, punch_text, summary_text
from .punchlog import Punch, PunchLog, work_day, work_days

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
# conversations.history errors that mean "this token may not read the channel": the post
# goes ahead, at least once, with a warning.
UNREADABLE_ERRORS = frozenset({"missing_scope", "not_in_channel", "no_permission", "access_denied"})
HISTORY_SCOPES = "channels:history (groups:history for a private channel)"
PUNCH_EVENT = "queickd_punch"  # the message metadata's event_type; its payload names the punch
LOOKUP_MARGIN = 600.0  # s before the tap the lookup starts: clock skew between the terminal and Slack
# A post reaches Slack some milliseconds after its job starts, more or fewer each time. Started
# exactly at Slack's pace, a post that came a little sooner than the last met a 429, and its
# retry waited a whole window more: the queue spaces the posts this much wider than the pace.
PACE_HEADROOM = 1.05
LOOKUP_PAGE, LOOKUP_PAGES = 200, 10  # at most this many messages are searched, newest first


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


class HistoryUnreadableError(SlackError):
    """The token may not read the channel's history, so a lost post cannot be looked for."""


@dataclass(frozen=True)
class SlackTarget:
    """Where and how to post. Holds file paths, never the secrets themselves."""

    channel: str | None = None
    token_file: str | None = None
    webhook_file: str | None = None
    base_url: str | None = None  # Web API base, ends in '/'; tests point it at a local server
    timeout: float = 10.0
    late_after: float = DEFAULT_LATE_AFTER

    @property
    def rate_key(self) -> str:
        """The rate key of the posts to this target: its channel's (a webhook posts to one)."""
        return f"slack:{self.channel}" if self.channel and not self.webhook_file else "slack:webhook"

    def rate_limit(self, per_second: float = 1.0) -> tuple[str, int, float]:
        """The post jobs' rate_limit: one post per 1/per_second seconds, and the headroom."""
        return (self.rate_key, 1, PACE_HEADROOM / per_second)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

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


def _classify(status: int, headers: dict[str, Any], error: str, method: str = "chat.postMessage",
              needed: str | None = None) -> Exception:
    lower = {k.lower(): v for k, v in (headers or {}).items()}
    method = method.replace("_", ".")
    if status == 429 or error == "ratelimited":
        try:
            after = float(lower.get("retry-after", 1))
        except (TypeError, ValueError):
            after = 1.0
        if not 0 <= after < math.inf:  # negative, NaN or infinite: as if none were given
            after = 1.0
        exc: Exception = SlackRateLimitedError(f"Slack rate limit on {method} (HTTP {status}); retry after "
                                               f"{after:g} s", after)
    elif status >= 500 or error in UNAVAILABLE_ERRORS:
        exc = SlackUnavailableError(f"Slack is unavailable (HTTP {status}: {error})")
    elif error in PERMANENT_ERRORS:
        scope = f", the token lacks the scope {needed}" if needed else ""
        exc = SlackRejectedError(f"Slack refused {method}: {error} (HTTP {status}{scope}); fix the Slack "
                                 "settings, then 'queick retry' the job")
    else:
        exc = SlackError(f"Slack refused {method}: {error or 'no error given'} (HTTP {status})")
    exc.slack_error = error  # type: ignore[attr-defined]
    return exc


def send(target: SlackTarget, text: str, metadata: dict[str, Any] | None = None) -> str | None:
    """Post text (with message metadata through the Web API; a webhook drops it); returns
    the message ts (None through a webhook). Raises the errors above; a rate limit's
    (SlackRateLimitedError, with Slack's retry_after) goes back to the queue at once."""
    webhook = _webhook(target)
    with _calling_slack():
        if webhook is not None:
            return _send_webhook(webhook, target, text)
        reply = _api(target, "chat_postMessage", channel=target.channel, text=text, metadata=metadata)
        return reply.get("ts")


def find_punch(target: SlackTarget, punch_id: str, since: float) -> str | None:
    """The ts of the message carrying `punch_id` in its metadata, posted in the target
    channel after `since` (searching at most LOOKUP_PAGES pages, newest first), or None.
    Raises HistoryUnreadableError if the token may not read the channel, else as send()."""
    cursor: str | None = None
    with _calling_slack():
        for _ in range(LOOKUP_PAGES):
            try:
                reply = _api(target, "conversations_history", channel=target.channel, oldest=f"{since:.6f}",
                             include_all_metadata=True, limit=LOOKUP_PAGE, cursor=cursor)
            except SlackError as e:
                if getattr(e, "slack_error", None) in UNREADABLE_ERRORS:
                    raise HistoryUnreadableError(e.slack_error) from None  # type: ignore[attr-defined]
                raise
            for m in reply.get("messages") or []:
                meta = m.get("metadata") or {}
                if meta.get("event_type") == PUNCH_EVENT and (meta.get("event_payload") or {}).get("punch_id") == punch_id:
                    return m.get("ts")
            cursor = (reply.get("response_metadata") or {}).get("next_cursor")
            if not reply.get("has_more") or not cursor:
                return None
    log.warning("punch %s: not among the newest %d messages of %s, as far as the lookup goes; posting it, "
                "so it may appear twice", punch_id, LOOKUP_PAGE * LOOKUP_PAGES, target.channel)
    return None


def never_reached_slack(exc: BaseException) -> bool:
    """True if the request surely never got to Slack: the connection was refused or the
    name did not resolve. A timeout or a dropped connection may have posted."""
    e: BaseException | None = exc
    for _ in range(8):
        if e is None:
            return False
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, (ConnectionRefusedError, socket.gaierror)):
            return True
        e = e.__cause__ or e.__context__
    return False


def _webhook(target: SlackTarget) -> str | None:
    return _secret(target.webhook_file, WEBHOOK_CREDENTIAL) if target.token_file is None else None


@contextmanager
def _calling_slack() -> Iterator[None]:
    """Turns urllib's URLError, timeouts and refused or reset connections into
    SlackUnavailableError; Slack's own answers pass as they were classified."""
    try:
        yield
    except (SlackError, SlackUnavailableError):
        raise
    except Exception as e:
        if is_network_error(e):
            raise SlackUnavailableError(f"Slack is unreachable: {e}") from e
        raise


def _api(target: SlackTarget, method: str, **params: Any) -> Any:
    """Call a Web API method with the bot token; ok:false answers raise as _classify says."""
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    token = _secret(target.token_file, TOKEN_CREDENTIAL)
    if token is None:
        raise SlackRejectedError("no Slack token: give --slack-token-file or --slack-webhook-file, or a "
                                 f"systemd credential named {TOKEN_CREDENTIAL} or {WEBHOOK_CREDENTIAL}")
    if not target.channel:
        raise SlackRejectedError("posting with a bot token needs a channel (--slack-channel)")
    kw: dict[str, Any] = {"base_url": target.base_url} if target.base_url else {}
    client = WebClient(token=token, timeout=int(max(1, target.timeout)), retry_handlers=[], **kw)
    try:
        return getattr(client, method)(**{k: v for k, v in params.items() if v is not None})
    except SlackApiError as e:
        r = e.response
        raise _classify(r.status_code, dict(r.headers), str(r.get("error", "")), method, r.get("needed")) from None


def _send_webhook(url: str, target: SlackTarget, text: str) -> None:
    from slack_sdk.webhook import WebhookClient

    reply = WebhookClient(url, timeout=int(max(1, target.timeout)), retry_handlers=[]).send(text=text)
    if reply.status_code != 200:
        raise _classify(reply.status_code, dict(reply.headers), (reply.body or "").strip(), "the webhook")


def _open_log(db: str | None) -> PunchLog | None:
    if db is None or not os.path.exists(db):
        return None
    return PunchLog(db)


def post_punch(punch: dict[str, Any], slack: dict[str, Any], db: str | None = None) -> dict[str, Any]:
    """The job: post one punch, once. With `db` (the attendance log), a punch already marked
    posted is not posted again; a punch whose earlier post may have reached Slack is looked
    for there first (Web API only); a successful post is marked."""
    p = Punch(**punch)
    target = SlackTarget(**slack)
    plog = _open_log(db)
    try:
        known = plog.punch(p.punch_id) if plog is not None else None
        if known is not None and known.posted_at is not None:
            return {"posted": False, "reason": "already posted", "ts": known.slack_ts}
        if plog is not None and known is not None:
            before = plog.begin_post(p.punch_id)  # committed before Slack is called
            if before is not None and before.maybe_posted:
                ts = _already_in_slack(p, target)
                if ts is not None:
                    plog.mark_posted(p.punch_id, ts)
                    log.info("punch %s was already in Slack (ts %s): not posted again", p.punch_id, ts)
                    return {"posted": False, "reason": "found in Slack", "ts": ts}
        metadata = {"event_type": PUNCH_EVENT, "event_payload": {"punch_id": p.punch_id}}
        try:
            ts = send(target, punch_text(p, time.time(), target.late_after), metadata)
        except (SlackError, SlackUnavailableError) as e:
            # Slack answered with an error, or was never reached: nothing was posted.
            if plog is not None and known is not None and (isinstance(e, SlackError) or never_reached_slack(e)):
                plog.post_not_sent(p.punch_id)
            raise
        if plog is not None:
            plog.mark_posted(p.punch_id, ts)
        log.info("punch %s posted (%s %s)", p.punch_id, p.name or p.card_id, p.direction)
        return {"posted": True, "ts": ts}
    finally:
        if plog is not None:
            plog.close()


def _already_in_slack(p: Punch, target: SlackTarget) -> str | None:
    """The ts of the punch's message if an earlier, cut-off post did reach Slack; None if
    it did not, or if that cannot be found out (then the post goes ahead: at least once)."""
    if target.token_file is None and _webhook(target) is not None:
        log.warning("punch %s: an earlier post may have reached Slack, and an incoming webhook cannot be "
                    "asked; posting it again, so it may appear twice", p.punch_id)
        return None
    try:
        return find_punch(target, p.punch_id, p.tapped_at - LOOKUP_MARGIN)
    except HistoryUnreadableError as e:
        log.warning("punch %s: an earlier post may have reached Slack, but the token cannot read %s's "
                    "history to check (%s); give the Slack app the scope %s. Posting it again, so it may "
                    "appear twice", p.punch_id, target.channel, e, HISTORY_SCOPES)
        return None


SUMMARY_MESSAGE_CHARS = 4_000  # Slack's advice for one message's text (it cuts off past 40,000)


def summary_messages(texts: list[str], limit: int = SUMMARY_MESSAGE_CHARS) -> list[str]:
    """Days' summaries packed, in order, into as few messages as keep each within `limit`
    characters; a day longer than that goes whole in a message of its own."""
    out: list[str] = []
    for text in texts:
        if out and len(out[-1]) + 2 + len(text) <= limit:
            out[-1] += "\n\n" + text
        else:
            out.append(text)
    return out


def post_daily_summary(db: str, slack: dict[str, Any], day_boundary: int | None = None) -> dict[str, Any]:
    """The cron job: post the hours per person of the work day its tick fell in (the day
    it was due, also when it runs late: a power cut, the network down past midnight), and
    of every work day after it through the one of the last tick folded into this run while
    it waited (the network down for three days: the three days, in as few messages as
    keep each within SUMMARY_MESSAGE_CHARS)."""
    first, last = cron_tick(), cron_last_tick()
    with PunchLog(db, day_boundary=day_boundary) as plog:
        if first is None or last is None:  # run by hand, not by its cron: today
            days = [work_day(time.time(), plog.day_boundary)]
        else:
            days = work_days(first, last, plog.day_boundary)
        texts = [summary_text(day, day_report(plog.punches(day))) for day in days]
    target = SlackTarget(**slack)
    sent = [send(target, text) for text in summary_messages(texts)]
    return {"posted": True, "ts": sent[0], "messages": sent, "day": days[0], "days": days}

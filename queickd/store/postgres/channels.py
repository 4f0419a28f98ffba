"""The PostgreSQL store's LISTEN/NOTIFY channels: named here once, for the Python side
(fleet.py, services/fleet.py) and for the SQL functions that notify (pass_sql.py).
Nothing here imports psycopg."""

CHANNEL = "queickd"  # the LISTEN/NOTIFY channel of wake-ups
# Finishes that free nothing (`f:IDS`) concern only clients waiting on those jobs, whom
# daemons serve: on a channel of their own, so a worker process is not woken by every
# finish of every other process (each delivery costs the listener's backend and thread).
FINISHED_CHANNEL = "queickd_finished"
# Jobs became claimable in a pool (`q:POOL`: submitted, promoted, moved): heard only by the
# processes whose pool claims. A daemon of no workers in front of a fleet heard the wake-up
# of every job it stored itself, for nothing (its listener's backend and thread, per job).
QUEUED_CHANNEL = "queickd_queued"
NOTIFY_IDS = 300  # job ids per finish notification (payloads are limited to 8000 bytes)

"""Long-lived parts of a daemon or worker process, one each: committer, worker pool, scheduler, fleet membership, network checker, systemd notifications. Each has start() and an idempotent stop()."""

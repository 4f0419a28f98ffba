"""The model: the job record, its states and fields, retry and cron schedules, the wire format, what a run's outcome means, and the pure policies. No I/O."""

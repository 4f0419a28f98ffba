"""Running jobs: what may run (the allowlist and loader) and the runners that execute a job."""

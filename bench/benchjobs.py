"""Job functions the benchmarks enqueue. Importable as the top-level module `benchjobs`:
queickd gets this directory as --app-dir, and Queick 1.2.1 (which imports jobs from its
working directory) runs in a temp directory holding a copy of this file."""


def noop():
    """Do nothing: the cost measured is the queue's, not the job's."""
    return None


def append_byte(path):
    """Append one byte to `path`: a visible trace that the job ran."""
    with open(path, "ab") as f:
        f.write(b".")

"""No-op workflow steps for bench/workflows.py (a task step and a fan-out item)."""


def step(state):
    return None


def item(item, state):
    return None


def noop():
    return None

"""Forwarding to an upstream daemon: an edge daemon stores the jobs its `[upstream]`
section routes there (`held`), and sends them on when the upstream can be reached.

- settings.py: the `[upstream]` section, checked, with its defaults.
- link.py: the connection to the upstream (the Python client's), and what its failures mean.
- backlog.py: the held jobs' count and bytes, kept in memory, and their cap.
- forwarder.py: the service: the thread that sends held jobs in batches.
- view.py: a forwarded job as `get` and `wait` show it: the upstream's state.
"""

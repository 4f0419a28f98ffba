"""The periodic upkeep of a daemon and a worker: small services, one a file (a single call
is an Every), each with its interval, run in order by one Maintainer (maintainer.py) at its
host's sweep."""

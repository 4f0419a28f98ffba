"""The periodic upkeep of a daemon and a worker: small services, one a file, each with its
interval and settings, run in order by one Maintainer (maintainer.py) at its host's sweep."""

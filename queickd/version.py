"""The package's version: one place, which the daemon's modules import without importing
the package's client names (queickd/__init__.py) along with it."""

__version__ = "0.1.0"

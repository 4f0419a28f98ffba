"""The store contract: what some stores can do and others cannot (capabilities.py)."""

"""Pure policies: each a plan computed from what a store read, applied by the store. No I/O, no clock."""

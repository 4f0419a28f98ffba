"""The in-memory store (`memory://`): the contract without durability, for tests and benchmarks,
with its undo journal for batches. The store itself is `store.MemoryStore`; open one through
`queickd.store.open_store`."""

"""The SQLite store (`sqlite:///path`): its file and connections, schema and migrations, claim,
durability (flush, checkpoint), and the `queick db` tools (check, backup, salvage, vacuum).
The store itself is `store.SQLiteStore`; open one through `queickd.store.open_store`."""

"""The PostgreSQL store (`postgresql://`): its connections, schema and migrations (with the SQL
functions they install), submit, claim and the fleet's records. The store itself is
`store.PostgresStore`; open one through `queickd.store.open_store`."""

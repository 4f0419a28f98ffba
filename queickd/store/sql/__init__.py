"""The SQL both SQL stores run, written once, as functions of a Dialect and a transaction."""

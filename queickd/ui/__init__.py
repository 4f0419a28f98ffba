"""What an operator sees: the stats picture, metrics, the status page and the terminal views."""

"""Job functions for the docker compose fleet (docker/docker-compose.yml)."""

import os
import socket


def where(greeting: str = "hello") -> str:
    """Say which container ran the job: shows a pool's jobs landing on its own worker."""
    return f"{greeting} from {socket.gethostname()} (pid {os.getpid()})"

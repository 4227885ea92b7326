"""Helpers for the suites that run brokers under testcontainers (marked ``docker``)."""

from __future__ import annotations


def docker_missing() -> str | None:
    """Why no Docker engine can be used here, or None when one answers."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as exc:  # no client package, no socket, no engine: all the same here
        return f"{type(exc).__name__}: {exc}"
    return None

"""Shared test helpers: private redis-server, free ports, process helpers."""

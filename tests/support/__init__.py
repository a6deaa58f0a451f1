"""Shared test helpers: private redis-server, free ports, process helpers."""

# How long a server the tests start may take to answer. Only a bound: each wait ends as
# soon as the server answers. Generous, since the suite runs in parallel on a loaded machine.
SERVER_READY_TIMEOUT_S = 90.0

"""Crash, outage, storm and hostile-input scenarios against real processes (issue
"Nothing lost, nothing leaked"). Run with ``pytest -m chaos``."""

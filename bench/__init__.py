"""Benchmarks of the agent worker; ``python -m bench`` runs them all and prints one table each."""

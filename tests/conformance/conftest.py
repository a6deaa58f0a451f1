"""The chaos tests' stack (real Redis, devhub, MCP servers, scripted model), reset per test."""

from tests.chaos.conftest import chaos, chaos_stack

__all__ = ["chaos", "chaos_stack"]

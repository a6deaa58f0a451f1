"""The integration tests that need the whole fleet (limits at their boundaries, a Redis that
refuses writes) run against the chaos stack: a real worker, devhub, MCP servers and
scripted model. Its fixtures are reused, not copied: one stack serves every such module."""

from tests.chaos.conftest import chaos, chaos_stack

__all__ = ["chaos", "chaos_stack"]

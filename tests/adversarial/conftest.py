"""The adversarial corpus runs against the chaos stack: a real worker, devhub, MCP servers
and scripted model, every secret a canary. Its fixtures are reused, not copied."""

from tests.chaos.conftest import chaos, chaos_stack

__all__ = ["chaos", "chaos_stack"]

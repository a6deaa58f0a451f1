"""hub-agent-worker: runs LLM agents for the Hub from rq tasks."""

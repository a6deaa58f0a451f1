"""Development and test aids: never imported by the worker itself.

- ``worker.dev.scripted_endpoint``: an OpenAI/Anthropic-compatible HTTP endpoint that answers
  from a script of turns (``python -m worker.dev.scripted_endpoint``).
- ``worker.dev.devstack``: starts redis-server, the devhub and our MCP servers as child
  processes for ``make demo``, the integration tests and the benchmarks.
- ``worker.dev.demo``: ``make demo`` (``python -m worker.dev.demo``) and its demo agent.
- ``worker.dev.realmodel``: ``make eval``: a real local model (llama-server, Qwen2.5-Coder from
  PyPI packages) and the scenarios it runs through the real worker.
"""

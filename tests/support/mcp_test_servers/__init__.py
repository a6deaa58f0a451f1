"""Small MCP servers for tests, served by ``mcp_servers._serving.serve``.

``python -m tests.support.mcp_test_servers.<name> --stdio`` serves over stdio,
``... --port <port>`` over streamable HTTP (with ``MCP_AUTH_TOKEN`` set, a bearer
token is required). ``stuck`` is no real server: it never answers ``initialize``.
"""

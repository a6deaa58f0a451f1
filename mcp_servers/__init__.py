"""Our MCP servers; each holds its own credentials so agents and models never see them.

    python -m mcp_servers.hub   Hub tools (search_posts, get_thread, get_feed, create_post,
                                create_comment); needs HUB_URL, holds HUB_API_KEY; port 8101
    python -m mcp_servers.web   fetch: a public web page as readable text, SSRF-safe; port 8102
    python -m mcp_servers.memory  search_memory, remember: the calling agent's own memory
                                (docs/how-to/memory.md); needs REDIS_URL and AGENTS_DIR; port 8103

Each serves streamable HTTP at ``/mcp`` on ``--host`` (default 127.0.0.1) and ``--port``,
or stdio with ``--stdio``. With ``MCP_AUTH_TOKEN`` set, HTTP requests need
``Authorization: Bearer <token>``. With ``CAPABILITY_KEY`` set, every tool call needs
the task's signed capability in its request ``_meta`` (set by the worker): the agent,
task and grants come from it, never from the rest of ``_meta``; without the key
(development) the caller named in ``_meta`` is trusted and the server warns at start.
"""

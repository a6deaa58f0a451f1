"""One TLS client context per process, shared by every outgoing HTTP client of a task.

httpx2 builds a new SSL context for each client it creates, and building one
reads the whole CA bundle: 30-40 ms. A job process opens several clients (the
Hub, the model provider, each MCP server over HTTP), so that was a large part of
a short task's overhead. ``worker.pipeline.preload`` builds the contexts once in
the worker parent; every forked job process inherits them.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx2


@cache
def client_ssl_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """The context httpx2 builds for ``verify=True`` (and this ``trust_env``), built once.

    Pass it as ``verify=`` to a client; ``trust_env`` must match the client's own,
    since it decides whether ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are honoured.
    """
    return httpx2.create_ssl_context(trust_env=trust_env)

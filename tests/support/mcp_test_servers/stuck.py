"""A stdio "MCP server" stuck at start-up: it reads requests and never answers ``initialize``.

Run: ``python -m tests.support.mcp_test_servers.stuck --stdio``. It ignores SIGTERM and an
end of its input too, as a wedged process does: only SIGKILL ends it.
"""

from __future__ import annotations

import signal
import sys
import time


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in sys.stdin:
        pass
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()

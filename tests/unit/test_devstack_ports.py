"""``free_port`` with ``DEVSTACK_PORTS``: each parallel test process draws from its own block."""

from __future__ import annotations

import socket
import subprocess
import sys


def ports_drawn(span: str, count: int, *, taken: int | None = None) -> list[int]:
    """``count`` ports from a fresh process's free_port with DEVSTACK_PORTS=``span``,
    while a socket of this process listens on ``taken``."""
    probe = (
        "from worker.dev.devstack import free_port; "
        f"print(' '.join(str(free_port()) for _ in range({count})))"
    )
    with socket.socket() as listener:
        if taken is not None:
            listener.bind(("127.0.0.1", taken))
            listener.listen()
        drawn = subprocess.run(
            [sys.executable, "-c", probe],
            env={"PATH": "/usr/bin:/bin", "DEVSTACK_PORTS": span},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    return [int(port) for port in drawn.stdout.split()]


def test_free_ports_come_from_the_block_each_once_until_it_is_used_up() -> None:
    ports = ports_drawn("18100-18109", 10)
    assert sorted(ports) == list(range(18100, 18110))


def test_a_port_something_listens_on_is_skipped() -> None:
    ports = ports_drawn("18120-18122", 2, taken=18121)
    assert sorted(ports) == [18120, 18122]

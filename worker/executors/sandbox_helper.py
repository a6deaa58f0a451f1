"""Runs inside a CLI's sandbox: the standard library only, no import of the worker.

The sandbox holds no network but its own loopback, and none of the worker's files:
the worker copies this file into the task's private directory and the sandbox runs it
with the system Python. Two commands:

``run --relay PORT=SOCKET ... --limit NAME=VALUE ... -- ARGV``
    The sandbox's first process. Listens on ``127.0.0.1:PORT`` inside the sandbox and
    relays each connection to the Unix ``SOCKET`` the worker mounted (the model
    endpoint's forwarder), sets the resource limits, then runs ``ARGV`` (the CLI) and
    exits with its status.
``bridge SOCKET [WAIT_S]``
    What the CLI's MCP configuration starts as its MCP server: copies stdin to the
    Unix ``SOCKET`` (the task's gateway, outside the sandbox) and the socket to stdout,
    once the gateway listens (waiting up to ``WAIT_S`` seconds for it).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time

_CHUNK = 65_536
# Resource limits by the names the worker passes (``--limit memory=...``).
_LIMITS = {
    "memory": resource.RLIMIT_DATA,
    "processes": resource.RLIMIT_NPROC,
    "file_size": resource.RLIMIT_FSIZE,
    "cpu_seconds": resource.RLIMIT_CPU,
    "open_files": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


def _pump(source: socket.socket | int, target: socket.socket | int) -> None:
    """Copy until ``source`` ends, then end ``target``'s writing side."""
    try:
        while True:
            if isinstance(source, socket.socket):
                data = source.recv(_CHUNK)
            else:
                data = os.read(source, _CHUNK)
            if not data:
                break
            if isinstance(target, socket.socket):
                target.sendall(data)
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(target, view) :]
    except OSError:
        pass
    finally:
        try:
            if isinstance(target, socket.socket):
                target.shutdown(socket.SHUT_WR)
            else:
                os.close(target)
        except OSError:
            pass


def _relay(listener: socket.socket, unix_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()


def _start_relay(spec: str) -> None:
    port, _, unix_path = spec.partition("=")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(64)
    threading.Thread(target=_relay, args=(listener, unix_path), daemon=True).start()


def _set_limit(spec: str) -> None:
    name, _, value = spec.partition("=")
    limit = int(value)
    resource.setrlimit(_LIMITS[name], (limit, limit))


def run(args: list[str]) -> int:
    relays: list[str] = []
    limits: list[str] = []
    while args and args[0] != "--":
        option, value, args = args[0], args[1], args[2:]
        (relays if option == "--relay" else limits).append(value)
    argv = args[1:]
    for relay in relays:
        _start_relay(relay)
    for limit in limits:
        _set_limit(limit)
    try:
        return subprocess.call(argv)
    except OSError as exc:
        print(f"sandbox: cannot start {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127


def bridge(unix_path: str, wait_s: float) -> int:
    # The worker starts the gateway as the CLI starts: wait for it to listen.
    deadline = time.monotonic() + wait_s
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(unix_path)
            break
        except OSError as exc:
            connection.close()
            if time.monotonic() >= deadline:
                print(f"sandbox bridge: cannot reach the gateway: {exc.strerror}", file=sys.stderr)
                return 1
            time.sleep(0.02)
    to_gateway = threading.Thread(target=_pump, args=(sys.stdin.fileno(), connection), daemon=True)
    to_gateway.start()
    _pump(connection, sys.stdout.fileno())
    return 0


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "run":
        return run(args)
    if command == "bridge":
        return bridge(args[0], float(args[1]) if len(args) > 1 else 0.0)
    print(f"sandbox helper: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

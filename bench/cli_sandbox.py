"""What the CLI sandbox adds to each CLI task: bwrap with its helper, the relay, the bridge.

Every row starts real processes the way a task does (``Sandbox.command``, as the
sandbox's user when the worker is root) and runs a trivial command in place of the CLI,
so the time is the sandbox's alone. The first row is the floor: the same interpreter
started without a sandbox. The gateway row runs alongside the CLI's own start-up (the
bridge waits for its socket).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx2

from bench._report import Summary, Table
from worker.dev.scripted_endpoint import ScriptedEndpoint
from worker.exceptions import ExecutorError
from worker.executors._cli_gateway import gateway_command, gateway_python_path
from worker.executors._egress import ModelRoute, model_forwarder
from worker.executors._gateway_link import GatewaySpec
from worker.executors._provider import ProviderAccess
from worker.executors._sandbox import HELPER, Sandbox, SandboxLimits, find_sandbox
from worker.executors._seccomp import seccomp_descriptor
from worker.settings import Settings

RELAY_PORT = 18080


def benchmark(*, quick: bool = False) -> list[Table]:
    runs = 5 if quick else 30
    table = Table(
        f"CLI sandbox start-up per task (ms, {runs} runs)",
        ["step", "median", "min-max"],
    )
    settings = Settings()
    try:
        sandbox = find_sandbox(settings)
    except ExecutorError as exc:  # the table says why there is nothing to measure
        table.notes.append(f"not measured: {exc}")
        return [table]
    with run_directory(sandbox) as (workspace, private), seccomp_descriptor() as seccomp_fd:
        limits = SandboxLimits.of(settings, 60)
        fds = (seccomp_fd,)
        bare = [sandbox.python, "-c", "pass"]
        table.add("python3 -c pass, unconfined (the floor)", *timed(runs, bare).cells())
        plain = sandbox.command(
            ["/bin/true"],
            workspace=workspace,
            private=private,
            relays={},
            limits=limits,
            seccomp_fd=seccomp_fd,
        )
        table.add("bwrap + helper, then true", *timed(runs, plain, sandbox.uid, fds).cells())
        relayed = sandbox.command(
            ["/bin/true"],
            workspace=workspace,
            private=private,
            relays={RELAY_PORT: private / "model.sock"},
            limits=limits,
            seccomp_fd=seccomp_fd,
        )
        relay_row = timed(runs, relayed, sandbox.uid, fds)
        table.add("bwrap + helper + model relay, then true", *relay_row.cells())
        with echo_socket(private / "gateway.sock"):
            helper, gateway_socket = str(private / HELPER.name), str(private / "gateway.sock")
            bridge = [sandbox.python, helper, "bridge", gateway_socket]
            table.add(
                "bridge: start, one MCP line there and back",
                *timed(runs, bridge, stdin=b'{"jsonrpc":"2.0"}\n').cells(),
            )
        gateway_runs = max(3, runs // 5)
        table.add(
            f"gateway: start until it listens ({gateway_runs} runs)",
            *Summary.of([gateway_start_ms(private) for _ in range(gateway_runs)]).cells(),
        )
    table.notes.append(
        "added per task: the bwrap + helper + relay row minus the floor, plus the bridge "
        "(once per MCP connection); the gateway starts while the CLI does"
    )
    return [table, relay_table(runs * 4)]


def relay_table(requests: int) -> Table:
    """One Messages API call to a local endpoint, straight and through the model relay (the
    key swapped on the way): what the relay adds to each model call of a sandboxed CLI."""
    table = Table(
        f"model relay per model call (ms, {requests} calls on one connection)",
        ["path", "median", "min-max"],
    )
    with ScriptedEndpoint() as endpoint, tempfile.TemporaryDirectory() as directory:
        endpoint.set_scenario("default", [{"text": "ok"}] * (2 * requests))
        base_url = endpoint.anthropic_base_url
        access = ProviderAccess(
            provider="anthropic", model="m", api_key="sk-bench-key", base_url=base_url
        )
        socket_path = Path(directory) / "model.sock"

        async def measure() -> tuple[Summary, Summary]:
            straight = httpx2.AsyncClient(base_url=base_url)
            relayed = httpx2.AsyncClient(
                base_url="http://127.0.0.1:3128",
                transport=httpx2.AsyncHTTPTransport(uds=str(socket_path)),
            )
            async with (
                model_forwarder(socket_path, ModelRoute.of(access), "bench"),
                straight,
                relayed,
            ):
                return await _calls(straight, requests), await _calls(relayed, requests)

        straight, relayed = anyio.run(measure)
    table.add("straight to the endpoint", *straight.cells())
    table.add("through the relay (key added)", *relayed.cells())
    return table


async def _calls(client: httpx2.AsyncClient, requests: int) -> Summary:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": "placeholder", "anthropic-version": "2023-06-01"}
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        response = await client.post("/v1/messages", json=body, headers=headers)
        response.raise_for_status()
        samples.append((time.perf_counter() - started) * 1000)
    return Summary.of(samples)


def timed(
    runs: int,
    command: list[str],
    user: int | None = None,
    pass_fds: tuple[int, ...] = (),
    *,
    stdin: bytes | None = None,
) -> Summary:
    samples = []
    for _ in range(runs):
        for descriptor in pass_fds:  # bwrap reads the seccomp program from where it is
            os.lseek(descriptor, 0, os.SEEK_SET)
        started = time.perf_counter()
        subprocess.run(
            command,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            check=True,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
            cwd="/",
            pass_fds=pass_fds,
        )
        samples.append((time.perf_counter() - started) * 1000)
    return Summary.of(samples)


@contextmanager
def run_directory(sandbox: Sandbox) -> Iterator[tuple[Path, Path]]:
    """A task's run directory, laid out and owned as the executor does it."""
    root = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    try:
        root.chmod(0o711)
        workspace, private = root / "workspace", root / "cli"
        workspace.mkdir()
        private.mkdir()
        shutil.copyfile(HELPER, private / HELPER.name)
        (private / HELPER.name).chmod(0o644)
        sandbox.prepare(workspace, private)
        yield workspace, private
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def echo_socket(path: Path) -> Iterator[None]:
    """A Unix socket that sends back each connection's bytes (the gateway's stand-in)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o666)
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                while data := connection.recv(65536):
                    connection.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        listener.close()
        path.unlink(missing_ok=True)


def gateway_start_ms(private: Path) -> float:
    socket_path = private / "bench-gateway.sock"
    config = private / "bench-mcp.yaml"
    config.write_text("servers: {}\n")
    spec = GatewaySpec(
        agent_id="bench-agent",
        task_id="bench-task",
        mcp_config=config,
        call_log=private / "bench-calls.jsonl",
        grants=("kit:read",),
        deadline_epoch_s=time.time() + 60,
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": gateway_python_path()}
    started = time.perf_counter()
    process = subprocess.Popen(
        gateway_command(socket_path),
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env | spec.environment(),
    )
    assert process.stdin is not None
    process.stdin.write(json.dumps({}).encode())
    process.stdin.close()
    try:
        return _until(lambda: socket_path.exists(), process, started)
    finally:
        process.kill()
        process.wait()
        socket_path.unlink(missing_ok=True)


def _until(ready: Callable[[], bool], process: subprocess.Popen[bytes], started: float) -> float:
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with status {process.returncode}")
        time.sleep(0.002)
    return (time.perf_counter() - started) * 1000


if __name__ == "__main__":
    for result in benchmark(quick="--quick" in sys.argv):
        print(result.render())

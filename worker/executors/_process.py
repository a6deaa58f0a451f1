"""Running one CLI process: its own process group, bounded output, killed whole at the end.

The CLI starts helpers of its own (MCP servers, language servers, shells). Started
with ``start_new_session``, all of them that stay in its group go with it: at the
deadline, on a stop request, and after a normal exit (leftovers holding the pipes).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import anyio
import anyio.abc

from worker._spawn import SpawnHook, ignore_spawn


class StopReason(StrEnum):
    """Why the executor stopped a CLI before it finished."""

    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    # The gateway's call log reported a call without its grant (strict grants).
    AUTONOMY_VIOLATION = "autonomy_violation"
    # The task's gateway exited while the CLI ran.
    GATEWAY_FAILED = "gateway_failed"


# Why the executor must stop a CLI now, or None to let it run on.
StopCheck = Callable[[], Awaitable[StopReason | None]]

# Between SIGTERM and SIGKILL of the group: time for the CLI to close its MCP servers.
TERMINATE_GRACE_S = 2.0
# After the leader exits: time for the pipes to drain once its group is gone.
DRAIN_GRACE_S = 2.0
_EXIT_POLL_S = 0.05
_READ_CHUNK = 65_536


@dataclass(slots=True, kw_only=True)
class ProcessOutcome:
    """How the process ended and what it wrote."""

    # The exit status; negative for a signal (the CLI's or ours).
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    # Set when the executor ended it: the deadline or the reason a StopCheck gave.
    stopped: StopReason | None = None
    stdout_truncated: bool = False


class _Capture:
    """Keeps the first ``limit`` bytes (stdout) or the last ``limit`` bytes (stderr)."""

    def __init__(self, limit: int, *, keep_tail: bool) -> None:
        self.limit = limit
        self.keep_tail = keep_tail
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.limit:
            self.truncated = True
            if self.keep_tail:
                del self.data[: len(self.data) - self.limit]
            else:
                del self.data[self.limit :]


async def run_cli_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    stdin_data: bytes | None,
    timeout_s: float,
    on_spawn: SpawnHook = ignore_spawn,
    should_stop: StopCheck | None = None,
    poll_interval_s: float = 0.5,
    max_stdout_bytes: int = 32 * 1024 * 1024,
    max_stderr_bytes: int = 64 * 1024,
    user: int | None = None,
    pass_fds: Sequence[int] = (),
) -> ProcessOutcome:
    """Run ``argv`` to its end, ``timeout_s``, or a stop request; its group never outlives this.
    With ``user``, it runs as that uid and gid with no supplementary groups; ``pass_fds``
    stay open in it (the sandbox's seccomp program)."""
    process = await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
        pass_fds=pass_fds,
    )
    group = process.pid  # the session leader's pid is the group id
    stdout = _Capture(max_stdout_bytes, keep_tail=False)
    stderr = _Capture(max_stderr_bytes, keep_tail=True)
    try:
        on_spawn(group)
        stopped = await _supervise(
            process,
            stdin_data,
            stdout,
            stderr,
            timeout_s=timeout_s,
            should_stop=should_stop,
            poll_interval_s=poll_interval_s,
        )
    finally:
        with anyio.CancelScope(shield=True):
            _signal_group(group, signal.SIGKILL)
            with anyio.move_on_after(TERMINATE_GRACE_S):
                await process.aclose()
    return ProcessOutcome(
        exit_code=None if stopped is not None else process.returncode,
        stdout=bytes(stdout.data),
        stderr=bytes(stderr.data),
        stopped=stopped,
        stdout_truncated=stdout.truncated,
    )


async def _supervise(
    process: anyio.abc.Process,
    stdin_data: bytes | None,
    stdout: _Capture,
    stderr: _Capture,
    *,
    timeout_s: float,
    should_stop: StopCheck | None,
    poll_interval_s: float,
) -> StopReason | None:
    """Feed stdin and capture both outputs until the process exits, the deadline or a stop
    request; then end its whole group and let the pipes drain. Why it was stopped, if so."""
    group = process.pid
    async with anyio.create_task_group() as pumps:
        readers_done = _ReadersDone(count=2)
        assert process.stdout is not None and process.stderr is not None
        pumps.start_soon(_read, process.stdout, stdout, readers_done)
        pumps.start_soon(_read, process.stderr, stderr, readers_done)
        if stdin_data is not None:
            pumps.start_soon(_feed, process, stdin_data)
        with anyio.move_on_after(timeout_s) as deadline_scope:
            stopped = await _wait_or_stop(process, should_stop, poll_interval_s)
        if deadline_scope.cancelled_caught:
            stopped = StopReason.DEADLINE
        if stopped is not None:
            await _terminate_group(process, group)
        # The leader is gone: whatever stayed in its group would hold the pipes open.
        _signal_group(group, signal.SIGKILL)
        with anyio.move_on_after(DRAIN_GRACE_S):
            await readers_done.wait()
        pumps.cancel_scope.cancel()
    return stopped


class _ReadersDone:
    def __init__(self, *, count: int) -> None:
        self._left = count
        self._event = anyio.Event()

    def one_done(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


async def _read(stream: anyio.abc.ByteReceiveStream, capture: _Capture, done: _ReadersDone) -> None:
    try:
        while True:
            try:
                chunk = await stream.receive(_READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            capture.add(chunk)
    finally:
        done.one_done()


async def _feed(process: anyio.abc.Process, data: bytes) -> None:
    assert process.stdin is not None
    # A CLI that exits without reading its prompt closes the pipe: nothing to report.
    with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await process.stdin.send(data)
        await process.stdin.aclose()


async def _wait_or_stop(
    process: anyio.abc.Process, should_stop: StopCheck | None, poll_interval_s: float
) -> StopReason | None:
    """None once the process exits; the reason, if ``should_stop`` asks for a stop first."""
    since_poll = 0.0
    # Polling, not process.wait(): on asyncio that also waits for the pipes to reach EOF.
    while process.returncode is None:
        await anyio.sleep(_EXIT_POLL_S)
        since_poll += _EXIT_POLL_S
        if should_stop is not None and since_poll >= poll_interval_s:
            since_poll = 0.0
            reason = await should_stop()
            if reason is not None:
                return reason
    return None


async def _terminate_group(process: anyio.abc.Process, group: int) -> None:
    _signal_group(group, signal.SIGTERM)
    with anyio.move_on_after(TERMINATE_GRACE_S):
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(_EXIT_POLL_S)
    _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def kill_process_groups(pids: Sequence[int]) -> None:
    """SIGKILL the groups led by ``pids`` (stdio servers the gateway started in their own
    sessions); a group that is already gone is skipped."""
    for pid in pids:
        _signal_group(pid, signal.SIGKILL)


def kill_gateway(pid: int) -> None:
    """SIGKILL a gateway process the CLI left behind, if it is still that gateway."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return  # gone already (or not Linux: its own stdin closing stops it)
    if b"mcp_servers.gateway" in command:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

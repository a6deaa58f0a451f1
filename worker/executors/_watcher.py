"""What a CLI executor polls while the CLI runs: the gateway's call log and the task's control.

The call log brings the pids the gateway started (registered at once, so a hard crash
kills them), the writes it held back for a cap and a strict-grants violation; the
control brings a cancel. ``check`` answers why the CLI must stop, if it must.
"""

from __future__ import annotations

from pathlib import Path

from worker.executors._base import ExecutionRequest
from worker.executors._call_log import GatewayActivity, merge, read_call_log
from worker.executors._process import StopReason, kill_gateway, kill_process_groups
from worker.logs import log_event


class CliWatcher:
    """Polled while the CLI runs: the gateway's call log (pids, violations) and cancel."""

    def __init__(
        self, request: ExecutionRequest, call_log: Path | None, activity: GatewayActivity
    ) -> None:
        self._request = request
        self._call_log = call_log
        self._offset = 0
        self.activity = activity

    async def check(self) -> StopReason | None:
        self._read_call_log()
        if self.activity.violation is not None:
            return StopReason.AUTONOMY_VIOLATION
        polled = await self._request.control.poll()
        if polled.steering:
            log_event(
                "steer_ignored",
                "warning",
                task=self._request.task.task_id,
                messages=len(polled.steering),
                detail="a CLI executor cannot take new messages while it runs",
            )
        return StopReason.CANCELLED if polled.cancelled else None

    def finish(self) -> None:
        """Last read of the call log; then stop whatever the gateway left running."""
        self._read_call_log()
        kill_process_groups(self.activity.server_pids)
        for pid in self.activity.gateway_pids:
            kill_gateway(pid)

    def _read_call_log(self) -> None:
        if self._call_log is None:
            return
        more, self._offset = read_call_log(self._call_log, offset=self._offset)
        # Registered at once: after a hard crash the worker parent kills them. (The
        # gateway itself was registered when the executor started it.)
        for pid in more.server_pids:
            self._request.on_spawn(pid)
        # Logged and counted as the native loop's are, while the CLI still runs.
        for refusal, via in more.refusals:
            self._request.on_write_refused(refusal, via)
        for scope_refusal in more.scope_refusals:
            self._request.on_scope_refused(scope_refusal)
        merge(self.activity, more)

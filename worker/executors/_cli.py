"""The CLI executors' shared run: scratch workspace, gateway, process, deadline, parse.

run(request):  check the agent → find the binary → the sandbox (``_sandbox``; fail
               closed) → the provider credential → run directory (workspace, private
               files, ``_cli_job``) → the worker starts the gateway (``_cli_gateway``:
               granted tools only, secrets on its stdin, a HOME the sandbox never sees)
               and the model relay (``_egress``: it adds the provider key, the CLI holds
               a placeholder) →
               the CLI's command line (subclass), wrapped in bwrap → run it in its own
               process group until it exits, the deadline, a cancel or a strict-grants
               violation → read the gateway's call log → parse the CLI's output
               (subclass) → the same RunResult as the native loop

A subclass names its binary and overrides ``invocation`` (command line, environment,
stdin) and ``parse`` (stdout into a CliTranscript); everything else is here.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import ClassVar

from hub_client.retry_rules import Failure, classify_status
from worker.agents import AgentDefinition
from worker.exceptions import (
    AutonomyViolation,
    ConfigurationError,
    ExecutorError,
    ModelAuthError,
    ModelError,
    ModelRequestError,
    ModelUnavailable,
    TaskFailed,
    WorkerError,
)
from worker.executors._base import ExecutionRequest, Executor
from worker.executors._call_log import GatewayActivity
from worker.executors._cli_gateway import (
    GATEWAY_SOCKET,
    GatewayProcess,
    bridge_launch,
    running_gateway,
    task_gateway,
)
from worker.executors._cli_job import (
    CliInvocation,
    CliJob,
    RunDirectory,
    task_deadline_epoch,
)
from worker.executors._egress import PLACEHOLDER_KEY, RELAY_PORT, ModelRoute, model_forwarder
from worker.executors._gateway_link import GatewaySpec
from worker.executors._process import ProcessOutcome, StopReason, run_cli_process
from worker.executors._provider import ProviderAccess, minimal_environment, provider_access
from worker.executors._sandbox import (
    Sandbox,
    SandboxLimits,
    find_sandbox,
    python_for_bridge,
    sandbox_warning,
)
from worker.executors._seccomp import seccomp_descriptor
from worker.executors._transcript import CliTranscript, RunContext, run_result
from worker.executors._watcher import CliWatcher
from worker.logs import log_event
from worker.loop import EventBus, RunResult, log_observer
from worker.redaction import Redactor
from worker.task import Outcome
from worker.tracing import trace_environment, traced_cli_run

CANCELLED_TEXT = "The task was cancelled."
_STDERR_TAIL_CHARS = 600
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The model relay's socket in the run's private directory.
MODEL_SOCKET = "model.sock"


class CliExecutor(Executor):
    """Runs a coding-agent CLI non-interactively for the whole task: its loop is the iteration.

    Use a subclass (``executor_for("claude-code")``); ``executable`` defaults to the
    binary found on PATH. Settings and grants come with each ``ExecutionRequest``.
    """

    binary: ClassVar[str] = ""
    # How an operator installs the CLI (`agent-worker check`, `executors`, a task's error).
    install_command: ClassVar[str] = ""
    # What `agent-worker executors` says about tools for this CLI.
    tool_support: ClassVar[str] = "MCP tools through mcp_servers.gateway (granted tools only)"
    speaks_mcp: ClassVar[bool] = True

    def __init__(self, *, executable: str | None = None) -> None:
        self._executable = executable

    def executable_path(self) -> str | None:
        """The CLI binary this executor would run, or None when it is not installed."""
        return shutil.which(self._executable or self.binary)

    # --- what a subclass provides ------------------------------------------------------------

    def check_agent(self, agent: AgentDefinition) -> None:
        """Raise AgentConfigError for a definition this CLI cannot honour."""

    def invocation(self, job: CliJob) -> CliInvocation:
        raise NotImplementedError

    def parse(self, job: CliJob, output: ProcessOutcome) -> CliTranscript:
        """The transcript in the CLI's stdout; ExecutorError when it is not there."""
        raise NotImplementedError

    # --- the run -------------------------------------------------------------------------------

    async def run(self, request: ExecutionRequest) -> RunResult:
        """One CLI run of the task, in one ``invoke_agent {executor}`` span."""
        return await traced_cli_run(
            lambda: self._run_traced(request),
            executor=self.name,
            task_id=request.task.task_id,
            agent=request.agent.config.name,
        )

    async def _run_traced(self, request: ExecutionRequest) -> RunResult:
        started = time.monotonic()
        context = RunContext(
            executor=self.name,
            task_id=request.task.task_id,
            agent_id=request.agent.config.name,
            provider=request.agent.config.brain.provider,
            model=request.agent.config.brain.model,
            messages=request.messages,
            strict_grants=request.grants.strict,
            events=EventBus(
                [
                    *request.observers,
                    log_observer(
                        task_id=request.task.task_id,
                        agent_id=request.agent.config.name,
                        executor=self.name,
                    ),
                ]
            ),
        )
        activity = GatewayActivity()
        try:
            transcript = await self._run(request, activity)
        except (ConfigurationError, TaskFailed) as exc:
            transcript = failed(exc)
        result = run_result(context, transcript, activity, duration_s=time.monotonic() - started)
        log_event(
            "cli_run",
            "info" if result.error is None else "warning",
            task=context.task_id,
            agent=context.agent_id,
            executor=self.name,
            outcome=result.outcome.value,
            turns=result.state.iterations,
            tool_calls=result.state.tool_calls,
            tokens_input=result.state.usage.input_tokens,
            tokens_output=result.state.usage.output_tokens,
            tokens_cache_read=result.state.usage.cache_read_tokens,
            tokens_cache_write=result.state.usage.cache_write_tokens,
            cost_usd=result.state.usage.cost_usd,
            duration_ms=round(result.duration_s * 1000, 1),
            error=str(result.error) if result.error is not None else None,
        )
        return result

    async def _run(self, request: ExecutionRequest, activity: GatewayActivity) -> CliTranscript:
        self.check_agent(request.agent)
        executable = self._require_executable()
        sandbox = self._sandbox(request)
        access = provider_access(request.agent, request.worker_settings)
        if request.resume:
            log_event(
                "cli_restarted",
                "warning",
                task=request.task.task_id,
                executor=self.name,
                detail="a CLI cannot resume a checkpoint: the task runs again from the start",
            )
        with tempfile.TemporaryDirectory(
            prefix=f"agent-{self.name}-", ignore_cleanup_errors=True
        ) as run_dir:
            run = RunDirectory.create(Path(run_dir), sandbox)
            deadline_epoch_s = task_deadline_epoch(request)
            gateway = task_gateway(request, run.root, deadline_epoch_s) if self.speaks_mcp else None
            # Confined, the CLI holds a placeholder key: the relay adds the real one.
            route = ModelRoute.of(access) if sandbox is not None else None
            job = CliJob.of(
                request,
                access.through_relay(route.inside_url, PLACEHOLDER_KEY) if route else access,
                executable,
                run,
                gateway=bridge_launch(python_for_bridge(sandbox), run.private)
                if gateway is not None
                else None,
            )
            async with AsyncExitStack() as services:
                gateway_process = None
                if gateway is not None:
                    gateway_process = await services.enter_async_context(
                        running_gateway(
                            gateway,
                            run.private / GATEWAY_SOCKET,
                            home=run.gateway_home,
                            on_spawn=request.on_spawn,
                        )
                    )
                if route is not None:
                    await services.enter_async_context(
                        model_forwarder(run.private / MODEL_SOCKET, route, request.task.task_id)
                    )
                outcome = await self._run_process(
                    job,
                    gateway.spec if gateway is not None else None,
                    activity,
                    deadline_epoch_s,
                    gateway_process=gateway_process,
                    sandbox=sandbox,
                )
            masked = gateway.masked if gateway is not None else ()
            redactor = Redactor([access.api_key, *masked])
            return self._transcript(job, outcome, activity, redactor)

    def _sandbox(self, request: ExecutionRequest) -> Sandbox | None:
        """The host's sandbox, or None when the operator turned it off (warned every run);
        ExecutorError naming what is missing when it is on but unavailable (fail closed)."""
        settings = request.worker_settings
        if settings.cli_sandbox == "off":
            log_event(
                "cli_sandbox_off",
                "warning",
                task=request.task.task_id,
                executor=self.name,
                detail=sandbox_warning(),
            )
            return None
        return find_sandbox(settings)

    async def _run_process(
        self,
        job: CliJob,
        spec: GatewaySpec | None,
        activity: GatewayActivity,
        deadline_epoch_s: float,
        *,
        gateway_process: GatewayProcess | None,
        sandbox: Sandbox | None,
    ) -> ProcessOutcome:
        """Run the CLI until it exits, the deadline, a cancel or a strict-grants violation."""
        invocation = self.invocation(job)
        # TRACEPARENT: a CLI that reads it continues this run's trace.
        env = minimal_environment(str(job.workspace)) | invocation.env | trace_environment()
        watcher = CliWatcher(job.request, spec.call_log if spec is not None else None, activity)

        async def should_stop() -> StopReason | None:
            if gateway_process is not None and gateway_process.exited():
                return StopReason.GATEWAY_FAILED
            return await watcher.check()

        with ExitStack() as descriptors:
            argv, user = invocation.argv, None
            pass_fds: tuple[int, ...] = ()
            if sandbox is not None:
                seccomp_fd = descriptors.enter_context(seccomp_descriptor())
                argv = confined_command(job, invocation, sandbox, deadline_epoch_s, seccomp_fd)
                env["PATH"] = sandbox.inside_path(invocation.argv[0])
                user, pass_fds = sandbox.uid, (seccomp_fd,)
            try:
                return await run_cli_process(
                    argv,
                    env=env,
                    cwd=job.workspace,
                    stdin_data=invocation.stdin,
                    timeout_s=max(0.0, deadline_epoch_s - time.time()),
                    on_spawn=job.request.on_spawn,
                    should_stop=should_stop,
                    user=user,
                    pass_fds=pass_fds,
                )
            except OSError as exc:
                raise ExecutorError(f"{self.name}: cannot start {job.executable}: {exc}") from exc
            finally:
                watcher.finish()

    def _transcript(
        self, job: CliJob, outcome: ProcessOutcome, activity: GatewayActivity, redact: Redactor
    ) -> CliTranscript:
        limits = job.request.settings.limits
        if activity.violation is not None:
            return self._partial(job, outcome).fail(AutonomyViolation(activity.violation))
        if outcome.stopped is StopReason.DEADLINE:
            stopped = self._partial(job, outcome)
            stopped.outcome = Outcome.DEADLINE
            stopped.detail = (
                f"max_duration_s reached: {self.name} was stopped at the task's deadline "
                f"({limits.max_duration_s:g} s from its first start)"
            )
            return stopped
        if outcome.stopped is StopReason.GATEWAY_FAILED:
            return failed(
                ExecutorError(
                    f"{self.name} was stopped: the task's gateway exited while it ran "
                    "(its reason is in the worker's log)"
                )
            )
        if outcome.stopped is StopReason.CANCELLED:
            stopped = self._partial(job, outcome)
            stopped.outcome = Outcome.CANCELLED
            stopped.output = stopped.output or CANCELLED_TEXT
            stopped.detail = "cancelled by an operator"
            return stopped
        if outcome.stdout_truncated:
            return failed(ExecutorError(f"{self.name} wrote more output than the worker keeps"))
        try:
            transcript = self.parse(job, outcome)
        except ExecutorError as exc:
            if outcome.exit_code == 0:
                return failed(ExecutorError(redact(exc.message)))
            transcript = CliTranscript(output="")  # the exit status says more, below
        # A limit (max turns, budget) may exit non-zero too: only an "answer" must exit 0.
        if (
            outcome.exit_code != 0
            and transcript.error is None
            and transcript.outcome is Outcome.COMPLETED
        ):
            transcript.fail(
                ExecutorError(
                    f"{self.name} exited with status {outcome.exit_code}: "
                    f"{stderr_tail(outcome.stderr, redact)}"
                )
            )
        return transcript

    def _partial(self, job: CliJob, outcome: ProcessOutcome) -> CliTranscript:
        """What a CLI stopped midway had already reported (OpenCode's events, say): turns,
        usage, its last text. A CLI that reports only at the end has nothing: unknown usage."""
        try:
            partial = self.parse(job, outcome)
        except ExecutorError:
            return CliTranscript(output="")
        partial.error = None
        return partial

    def not_installed(self) -> str:
        """What to tell an operator whose worker lacks this CLI."""
        return (
            f"{self.name}: the `{self._executable or self.binary}` executable is not "
            f"installed on this worker (install it with `{self.install_command}`; "
            "docs/cli-sandbox.md says how to put it in an image)"
        )

    def _require_executable(self) -> str:
        path = self.executable_path()
        if path is None:
            raise ExecutorError(self.not_installed())
        return path


def confined_command(
    job: CliJob,
    invocation: CliInvocation,
    sandbox: Sandbox,
    deadline_epoch_s: float,
    seccomp_fd: int,
) -> list[str]:
    """The CLI's command line inside its sandbox, its model port relayed to the worker."""
    return sandbox.command(
        invocation.argv,
        workspace=job.workspace,
        private=job.private,
        relays={RELAY_PORT: job.private / MODEL_SOCKET},
        limits=SandboxLimits.of(
            job.request.worker_settings, max(1.0, deadline_epoch_s - time.time())
        ),
        seccomp_fd=seccomp_fd,
    )


def failed(error: WorkerError) -> CliTranscript:
    """The transcript of a run that failed before or instead of an answer."""
    return CliTranscript(output="").fail(error)


def stderr_tail(stderr: bytes, redact: Redactor) -> str:
    """The end of what the CLI wrote on stderr, one line, secrets masked."""
    text = _ANSI_ESCAPE.sub("", stderr.decode("utf-8", "replace"))
    # Redacted whole, then cut: a secret halved by the cut is no longer recognisable.
    text = " ".join(redact(text).split())
    if not text:
        return "(nothing on stderr)"
    if len(text) > _STDERR_TAIL_CHARS:
        text = "…" + text[-_STDERR_TAIL_CHARS:]
    return text


def model_error(
    status: int | None, message: str, *, executor: str, access: ProviderAccess
) -> WorkerError:
    """The error for a provider failure a CLI reported with its HTTP status.

    The status means what it means to the native models (``classify_status``), so the
    worker reacts the same way: transient ones requeue the task, 401/403 and refusals
    fail it (model_error). A failure the CLI gave no status for is the executor's.
    """
    where = f"{executor}: {access.provider} model {access.model!r}"
    text = f"{where} failed: {message}" if message else f"{where} failed"
    if status is None:
        return ExecutorError(text)
    error_class: type[ModelError] = {
        Failure.TRANSIENT: ModelUnavailable,
        Failure.AUTH: ModelAuthError,
        Failure.REFUSED: ModelRequestError,
    }[classify_status(status)]
    return error_class(f"{text} (HTTP {status})", provider=access.provider, model=access.model)

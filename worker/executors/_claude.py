"""``claude-code``: Claude Code in print mode (``claude -p``), one JSON result on stdout.

Command line (flags checked against ``claude --help`` 2.1.x and by running it)::

    claude -p --output-format json --model <m> --system-prompt-file <file>
           --max-turns <max_iterations> --strict-mcp-config --no-session-persistence
           --tools "" [--mcp-config <file> --allowedTools mcp__gateway]
           [--max-budget-usd <max_cost_usd>]

The prompt goes on stdin and the system prompt in a file: neither is limited by the
size of one argument nor shown by ``ps``. The MCP config (with the gateway's
environment block) is a file in the private directory for the same reason.
``--allowedTools mcp__gateway`` allows every tool of the gateway, which only lists
the agent's granted tools; built-in tools are removed (``--tools ""``) unless
``capabilities.shell.enabled``, which gives Bash limited to ``allowed_commands``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.agents import AgentDefinition
from worker.exceptions import AgentConfigError, ExecutorError
from worker.executors._cli import CliExecutor, model_error
from worker.executors._cli_gateway import GATEWAY_SERVER
from worker.executors._cli_job import CliInvocation, CliJob
from worker.executors._process import ProcessOutcome
from worker.executors._transcript import CliTranscript, CliTurn
from worker.loop import ToolCallRecord, ToolOutcome
from worker.models import Usage
from worker.task import Outcome

# Claude Code retries API errors many times by default (a 401 hung for minutes).
MAX_RETRIES = "2"


class ClaudeCodeExecutor(CliExecutor):
    name = "claude-code"
    binary = "claude"
    install_command = "npm install -g @anthropic-ai/claude-code"

    def check_agent(self, agent: AgentDefinition) -> None:
        if agent.config.brain.provider != "anthropic":
            raise AgentConfigError(
                f"agents/{agent.config.name}/config.yaml: type claude-code speaks only the "
                "Anthropic Messages API; set brain.provider: anthropic (an Anthropic-compatible "
                "endpoint goes in brain.api_base)"
            )

    def invocation(self, job: CliJob) -> CliInvocation:
        system_file = job.private / "system-prompt.md"
        system_file.write_text(job.system, encoding="utf-8")
        argv = [
            job.executable,
            "-p",
            "--output-format",
            "json",
            "--model",
            job.access.model,
            "--system-prompt-file",
            str(system_file),
            "--max-turns",
            str(job.max_turns),
            "--strict-mcp-config",
            "--no-session-persistence",
        ]
        allowed: list[str] = []
        shell = job.agent.config.capabilities.shell
        if shell.enabled:
            argv += ["--tools", "Bash"]
            allowed += [f"Bash({command}:*)" for command in shell.allowed_commands] or ["Bash"]
            if shell.blocked_patterns:
                blocked = [f"Bash({pattern}:*)" for pattern in shell.blocked_patterns]
                argv += ["--disallowedTools", ",".join(blocked)]
        else:
            argv += ["--tools", ""]
        if job.gateway is not None:
            argv += ["--mcp-config", str(_write_mcp_config(job))]
            allowed.append(f"mcp__{GATEWAY_SERVER}")
        if allowed:
            argv += ["--allowedTools", ",".join(allowed)]
        if job.max_cost_usd is not None:
            argv += ["--max-budget-usd", f"{job.max_cost_usd:.4f}"]
        settings = job.request.settings
        env = {
            "ANTHROPIC_API_KEY": job.access.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_RETRIES": MAX_RETRIES,
            # By default the first model call goes out after 5 s even if the gateway is
            # still starting (it imports the worker): wait for it, within the deadline.
            "MCP_CONNECTION_NONBLOCKING": "0",
            "MCP_CONNECT_TIMEOUT_MS": str(int(min(60.0, settings.limits.max_duration_s) * 1000)),
            # The gateway bounds each call itself; Claude Code must not give up first.
            "MCP_TOOL_TIMEOUT": str(int((settings.tool_timeout_cap_s + 5) * 1000)),
        }
        if shell.enabled:
            # capabilities.shell.timeout_seconds bounds every command Claude Code runs.
            shell_timeout_ms = str(shell.timeout_seconds * 1000)
            env["BASH_DEFAULT_TIMEOUT_MS"] = env["BASH_MAX_TIMEOUT_MS"] = shell_timeout_ms
        if job.access.base_url:
            env["ANTHROPIC_BASE_URL"] = job.access.anthropic_base_url
        return CliInvocation(argv=argv, env=env, stdin=job.prompt.encode("utf-8"))

    def parse(self, job: CliJob, output: ProcessOutcome) -> CliTranscript:
        result = _result_object(output.stdout)
        text = result.get("result")
        text = text if isinstance(text, str) else ""
        subtype = str(result.get("subtype") or "")
        turns_taken = _int(result.get("num_turns"))
        if subtype == "error_max_turns":
            # num_turns then counts the turn it refused to start: no model call was made.
            turns_taken = min(turns_taken, job.max_turns)
        transcript = CliTranscript(
            output=text,
            turns=[CliTurn() for _ in range(max(turns_taken - 1, 0))] + [CliTurn(text=text)],
            usage=_usage(result),
            refused_calls=_refused_calls(result.get("permission_denials")),
        )
        if subtype == "error_max_turns":
            transcript.outcome = Outcome.MAX_ITERATIONS
            transcript.detail = (
                f"max_iterations reached: claude-code stopped after {turns_taken} turns "
                f"(--max-turns {job.max_turns})"
            )
        elif "budget" in subtype:
            transcript.outcome = Outcome.BUDGET
            transcript.detail = f"max_cost_usd reached: claude-code stopped ({subtype})"
        elif result.get("is_error"):
            # An API error can still say subtype "success": is_error is what counts.
            status = result.get("api_error_status")
            error = model_error(
                status if isinstance(status, int) else None,
                text[:300] or subtype,
                executor=self.name,
                access=job.access,
            )
            transcript.fail(error)
        return transcript


def _write_mcp_config(job: CliJob) -> Path:
    assert job.gateway is not None
    config = {
        "mcpServers": {
            GATEWAY_SERVER: {
                "type": "stdio",
                "command": job.gateway.executable,
                "args": job.gateway.args,
                "env": job.gateway.env,
            }
        }
    }
    path = job.private / "mcp-config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _result_object(stdout: bytes) -> dict[str, Any]:
    """The ``{"type": "result", ...}`` object: all of stdout, or its last JSON line."""
    text = stdout.decode("utf-8", "replace").strip()
    candidates = [text, *reversed(text.splitlines())]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and value.get("type") == "result":
            return value
    shown = text[:200] or "nothing"
    raise ExecutorError(f"claude-code printed no JSON result object on stdout (got: {shown})")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _usage(result: dict[str, Any]) -> Usage:
    usage = result.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    cost = result.get("total_cost_usd")
    cache_read = _int(usage.get("cache_read_input_tokens"))
    cache_write = _int(usage.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=_int(usage.get("input_tokens")) + cache_write + cache_read,
        output_tokens=_int(usage.get("output_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def _refused_calls(denials: Any) -> list[ToolCallRecord]:
    """Calls Claude Code refused itself (not allowed tools); they never reached the gateway."""
    if not isinstance(denials, list):
        return []
    refused = []
    for index, denial in enumerate(denials, start=1):
        if not isinstance(denial, dict):
            continue
        name = str(denial.get("tool_name") or "unknown")
        refused.append(
            ToolCallRecord(
                call_id=str(denial.get("tool_use_id") or f"denied-{index}"),
                name=name,
                arguments=json.dumps(denial.get("tool_input") or {}),
                server="",
                outcome=ToolOutcome.REFUSED,
                is_error=True,
                content=f"Error: claude-code refused {name}: not a tool this agent may use",
            )
        )
    return refused

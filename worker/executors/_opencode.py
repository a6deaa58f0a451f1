"""``opencode``: ``opencode run --format json``, one JSON event per line on stdout.

Command line (flags checked against ``opencode run --help`` 1.18.x)::

    opencode run -m <provider>/<model> --format json --title <task_id> --pure

The message goes on stdin. OpenCode has no flags for the system prompt, the endpoint,
MCP or permissions: all of it is configuration, passed in ``OPENCODE_CONFIG_CONTENT``
(the key itself stays in its own environment variable, referenced as ``{env:...}``):

- ``provider``: Anthropic through the built-in ``anthropic`` provider; OpenAI and
  OpenAI-compatible endpoints through ``@ai-sdk/openai-compatible`` (Chat Completions:
  the built-in ``openai`` provider speaks only the Responses API);
- ``agent.build.prompt``: the system prompt (replaces OpenCode's own);
- ``mcp.gateway``: the gateway as a local MCP server; its tools reach the model as
  ``gateway_<server>__<tool>``;
- ``permission``: every built-in tool denied (a denied tool is not even offered),
  the gateway's allowed, and ``bash`` only for ``capabilities.shell.allowed_commands``;
- ``small_model`` and ``--title``: no extra title-generation call to another model.

OpenCode has no turn limit (``agent.build.steps`` only nudges the model): the task's
deadline, enforced by killing its process group, is its hard limit.
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.exceptions import ExecutorError, WorkerError
from worker.executors._cli import CliExecutor, model_error
from worker.executors._cli_gateway import GATEWAY_SERVER
from worker.executors._cli_job import CliInvocation, CliJob
from worker.executors._process import ProcessOutcome
from worker.executors._provider import ProviderAccess
from worker.executors._transcript import CliTranscript, CliTurn
from worker.models import Usage

OPENAI_COMPATIBLE_PROVIDER = "worker-openai"


class OpenCodeExecutor(CliExecutor):
    name = "opencode"
    binary = "opencode"
    install_command = "npm install -g opencode-ai"

    def invocation(self, job: CliJob) -> CliInvocation:
        model_ref, key_variable, provider = _provider(job.access)
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": provider,
            "model": model_ref,
            "small_model": model_ref,
            "agent": {"build": {"prompt": job.system, "steps": job.max_turns}},
            "permission": _permissions(job),
            "autoupdate": False,
            "share": "disabled",
        }
        if job.gateway is not None:
            config["mcp"] = {
                GATEWAY_SERVER: {
                    "type": "local",
                    "command": job.gateway.command,
                    "environment": job.gateway.env,
                    "enabled": True,
                }
            }
        argv = [
            job.executable,
            "run",
            "-m",
            model_ref,
            "--format",
            "json",
            "--title",
            job.request.task.task_id,
            "--pure",
            # Its error events hide the cause ("UnknownError ... ref=err_…"); its log
            # lines on stderr name it, under the same ref.
            "--print-logs",
            "--log-level",
            "ERROR",
        ]
        env = {key_variable: job.access.api_key, "OPENCODE_CONFIG_CONTENT": json.dumps(config)}
        return CliInvocation(argv=argv, env=env, stdin=job.prompt.encode("utf-8"))

    def parse(self, job: CliJob, output: ProcessOutcome) -> CliTranscript:
        events = _events(output.stdout)
        turns: list[CliTurn] = []
        texts: list[str] = []
        tool_requests = 0
        usage = Usage()
        error_event: dict[str, Any] | None = None
        for event in events:
            kind = event.get("type")
            part = _object(event.get("part"))
            if kind == "step_start":
                texts, tool_requests = [], 0
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "tool_use" and str(part.get("tool", "")).startswith(GATEWAY_SERVER):
                tool_requests += 1
            elif kind == "step_finish":
                step_usage = _step_usage(part)
                usage.add(step_usage)
                turns.append(
                    CliTurn(text="".join(texts), usage=step_usage, tool_requests=tool_requests)
                )
                texts, tool_requests = [], 0
            elif kind == "error":
                error_event = event
        if texts:  # text after the last step_finish (a step cut short)
            turns.append(CliTurn(text="".join(texts), tool_requests=tool_requests))
        if usage.total_tokens and not usage.cost_usd:
            usage.cost_usd = None  # tokens for $0: a price OpenCode does not know
        answer = next((turn.text for turn in reversed(turns) if turn.text.strip()), "")
        transcript = CliTranscript(output=answer, turns=turns, usage=usage)
        if error_event is not None:
            transcript.fail(self._error(job, error_event, output.stderr))
        elif not turns:
            raise ExecutorError(
                f"opencode printed no step events on stdout "
                f"({len(events)} JSON event(s) of other types)"
            )
        return transcript

    def _error(self, job: CliJob, event: dict[str, Any], stderr: bytes) -> WorkerError:
        error = _object(event.get("error"))
        data = _object(error.get("data"))
        name = str(error.get("name") or "error")
        message = str(data.get("message") or error.get("message") or name)
        logged = _logged_error(stderr, str(data.get("ref") or ""))
        if name == "UnknownError" and logged is not None:
            name, _, message = logged.partition(": ")
        status = data.get("statusCode")
        if name == "ProviderAuthError":
            status = 401
        return model_error(
            status if isinstance(status, int) else None,
            f"{name}: {message[:300]}",
            executor=self.name,
            access=job.access,
        )


def _provider(access: ProviderAccess) -> tuple[str, str, dict[str, Any]]:
    """The model as OpenCode names it, the key's variable, and the ``provider`` entry. The
    agent's model is declared either way: offline, with a fresh HOME, OpenCode has no
    catalogue to look a model up in, and only a declared one works whatever its id."""
    models = {access.model: {"name": access.model}}
    if access.provider == "anthropic":
        key_variable = "ANTHROPIC_API_KEY"
        options = {
            "baseURL": f"{access.anthropic_base_url}/v1",
            "apiKey": f"{{env:{key_variable}}}",
        }
        return (
            f"anthropic/{access.model}",
            key_variable,
            {"anthropic": {"options": options, "models": models}},
        )
    key_variable = "OPENAI_API_KEY"
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "OpenAI-compatible endpoint of the worker",
        "options": {"baseURL": access.openai_base_url, "apiKey": f"{{env:{key_variable}}}"},
        "models": models,
    }
    return (
        f"{OPENAI_COMPATIBLE_PROVIDER}/{access.model}",
        key_variable,
        {OPENAI_COMPATIBLE_PROVIDER: provider},
    )


def _logged_error(stderr: bytes, ref: str) -> str | None:
    """OpenCode's own text for the error its event calls ``ref`` (``NameError: message``),
    from the ``level=ERROR ... ref=<ref> error="..."`` line it logged on stderr."""
    if not ref:
        return None
    pattern = re.compile(rf'ref={re.escape(ref)} error="((?:[^"\\]|\\.)*)"')
    match = pattern.search(stderr.decode("utf-8", "replace"))
    if match is None:
        return None
    return match.group(1).replace('\\"', '"').split("\\n", 1)[0]


def _permissions(job: CliJob) -> dict[str, Any]:
    permissions: dict[str, Any] = {"*": "deny"}
    if job.gateway is not None:
        permissions[f"{GATEWAY_SERVER}_*"] = "allow"
    shell = job.agent.config.capabilities.shell
    if shell.enabled:
        if shell.allowed_commands:
            bash: dict[str, str] = {"*": "deny"}
            bash.update({f"{command} *": "allow" for command in shell.allowed_commands})
            bash.update({command: "allow" for command in shell.allowed_commands})
        else:
            bash = {"*": "allow"}
        bash.update({f"*{pattern}*": "deny" for pattern in shell.blocked_patterns})
        permissions["bash"] = bash
    return permissions


def _events(stdout: bytes) -> list[dict[str, Any]]:
    events = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue  # OpenCode may print log lines between events
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and isinstance(event.get("type"), str):
            events.append(event)
    if not events:
        shown = stdout.decode("utf-8", "replace").strip()[:200] or "nothing"
        raise ExecutorError(f"opencode printed no JSON events on stdout (got: {shown})")
    return events


def _step_usage(part: dict[str, Any]) -> Usage:
    tokens = _object(part.get("tokens"))
    cache = _object(tokens.get("cache"))
    cost = part.get("cost")
    cache_read, cache_write = _count(cache.get("read")), _count(cache.get("write"))
    return Usage(
        input_tokens=_count(tokens.get("input")) + cache_read + cache_write,
        output_tokens=_count(tokens.get("output")) + _count(tokens.get("reasoning")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

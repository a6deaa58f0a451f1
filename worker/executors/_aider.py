"""``aider``: one ``--message`` run in ask mode; plain text out, no tool calling.

Command line (flags checked against ``aider --help`` 0.86.x)::

    aider --model openai/<m> | anthropic/<m> --message-file <prompt file>
          --model-settings-file <file with system_prompt_prefix> --chat-mode ask
          --yes-always --no-git --no-stream --no-pretty --no-check-update
          --no-show-model-warnings --no-show-release-notes --no-fancy-input --map-tokens 0
          --no-suggest-shell-commands --no-detect-urls --no-analytics --timeout <s>

Aider has no system-prompt flag: the agent's system prompt is the model's
``system_prompt_prefix`` in a generated settings file. ``--chat-mode ask`` keeps it
from editing files; shell commands and URL scraping are off whatever
``capabilities.shell`` says (aider cannot limit them to an allow-list).

Aider has no MCP and no tool calling. An aider agent whose definition claims tool
grants fails with an AgentConfigError naming the fix, rather than answering as if it
had used tools it never had; without grants it answers from the prompt alone.

Its answer is the text between aider's announcement lines and its
``Tokens: N sent, M received.`` line (plus ``Cost: $X message, $Y session.`` when
the model's price is known). Aider prints provider failures
(``litellm.AuthenticationError: ...``) and still exits 0: those become the same
model errors as for the native models.
"""

from __future__ import annotations

import re

import yaml

from worker.agents import AgentDefinition
from worker.exceptions import AgentConfigError, ExecutorError
from worker.executors._cli import CliExecutor, model_error
from worker.executors._cli_job import CliInvocation, CliJob
from worker.executors._process import ProcessOutcome
from worker.executors._transcript import CliTranscript, CliTurn
from worker.models import Usage

NO_TOOLS = "no tool calling: agents answer without tools"

# Aider's start-up announcements; the answer starts after the last of them.
_ANNOUNCEMENT = re.compile(
    r"^(Aider v\d|Model: |Main model: |Weak model: |Editor model: |Git repo: |Repo-map: |"
    r"Added .* to the chat|Restored previous conversation history|Multiline mode: )"
)
_TOKENS = re.compile(
    r"^Tokens: (?P<sent>[\d.]+k?) sent(?:, (?P<cache_write>[\d.]+k?) cache write)?"
    r"(?:, (?P<cache_hit>[\d.]+k?) cache hit)?, (?P<received>[\d.]+k?) received\."
    r"(?: Cost: \$(?P<message>[\d.]+) message, \$(?P<session>[\d.]+) session\.)?"
)
_PROVIDER_ERROR = re.compile(r"litellm\.(?P<kind>\w+Error|Timeout)\b:?\s*(?P<message>.*)")
# litellm's exception names, by the HTTP status the native models would have seen.
_ERROR_STATUS = {
    "AuthenticationError": 401,
    "PermissionDeniedError": 403,
    "NotFoundError": 404,
    "BadRequestError": 400,
    "UnprocessableEntityError": 422,
    "ContextWindowExceededError": 400,
    "ContentPolicyViolationError": 400,
    "RateLimitError": 429,
    "Timeout": 408,
    "APIConnectionError": 503,
    "ServiceUnavailableError": 503,
    "InternalServerError": 500,
    "APIError": 500,
}


class AiderExecutor(CliExecutor):
    name = "aider"
    binary = "aider"
    install_command = "pipx install aider-chat"
    tool_support = NO_TOOLS
    speaks_mcp = False

    def check_agent(self, agent: AgentDefinition) -> None:
        grants = agent.config.capabilities.grants
        if grants:
            raise AgentConfigError(
                f"agents/{agent.config.name}/config.yaml: aider agents cannot use tools "
                f"(aider has no tool calling), but capabilities.grants lists "
                f"{', '.join(grants)}; remove capabilities.grants or choose another type "
                "(claude-code, opencode, goose or native)"
            )

    def invocation(self, job: CliJob) -> CliInvocation:
        access = job.access
        model = f"{access.provider}/{access.model}"
        prompt_file = job.private / "message.md"
        prompt_file.write_text(job.prompt, encoding="utf-8")
        settings_file = job.private / "model-settings.yml"
        settings_file.write_text(
            yaml.safe_dump([{"name": model, "system_prompt_prefix": job.system}]),
            encoding="utf-8",
        )
        argv = [
            job.executable,
            "--model",
            model,
            "--message-file",
            str(prompt_file),
            "--model-settings-file",
            str(settings_file),
            "--chat-mode",
            "ask",
            "--yes-always",
            "--no-git",
            "--no-stream",
            "--no-pretty",
            "--no-check-update",
            "--no-show-model-warnings",
            "--no-show-release-notes",
            "--no-fancy-input",
            "--map-tokens",
            "0",
            "--no-suggest-shell-commands",
            "--no-detect-urls",
            "--no-analytics",
            "--timeout",
            f"{job.request.settings.llm_timeout_cap_s:g}",
        ]
        if access.provider == "anthropic":
            env = {"ANTHROPIC_API_KEY": access.api_key}
            if access.base_url:
                env["ANTHROPIC_BASE_URL"] = access.anthropic_base_url
        else:
            env = {"OPENAI_API_KEY": access.api_key, "OPENAI_API_BASE": access.openai_base_url}
        return CliInvocation(argv=argv, env=env)

    def parse(self, job: CliJob, output: ProcessOutcome) -> CliTranscript:
        lines = output.stdout.decode("utf-8", "replace").splitlines()
        tokens_at = next(
            (index for index in reversed(range(len(lines))) if _TOKENS.match(lines[index])), None
        )
        if tokens_at is None:
            for line in lines:
                failure = _PROVIDER_ERROR.search(line)
                if failure is not None:
                    status = _ERROR_STATUS.get(failure.group("kind"))
                    message = f"{failure.group('kind')}: {failure.group('message')[:300]}"
                    error = model_error(status, message, executor=self.name, access=job.access)
                    return CliTranscript(output="").fail(error)
            raise ExecutorError(
                "aider printed no `Tokens: N sent, M received.` line, so it did not answer "
                f"(last output: {' '.join(lines[-3:])[:200] or 'nothing'})"
            )
        start = max(
            (index + 1 for index in range(tokens_at) if _ANNOUNCEMENT.match(lines[index])),
            default=0,
        )
        answer = "\n".join(lines[start:tokens_at]).strip()
        usage = _usage(_TOKENS.match(lines[tokens_at]))
        return CliTranscript(output=answer, turns=[CliTurn(text=answer, usage=usage)], usage=usage)


def _usage(match: re.Match[str] | None) -> Usage:
    assert match is not None
    cost = match.group("session")
    cache_write, cache_hit = match.group("cache_write"), match.group("cache_hit")
    return Usage(
        # What aider says it sent counts the prompt cache's tokens too.
        input_tokens=_tokens(match.group("sent")),
        output_tokens=_tokens(match.group("received")),
        cost_usd=float(cost) if cost is not None else None,
        cache_read_tokens=_tokens(cache_hit) if cache_hit else 0,
        cache_write_tokens=_tokens(cache_write) if cache_write else 0,
    )


def _tokens(text: str) -> int:
    """Aider's counts: ``512``, ``1.2k`` (rounded to a hundred), ``12k`` (to a thousand)."""
    if text.endswith("k"):
        return round(float(text[:-1]) * 1000)
    return int(float(text))

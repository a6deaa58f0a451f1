"""``goose``: ``goose run`` headless, one JSON document on stdout.

Goose is not installable on the machines this was written on; the command line
follows its public documentation and source::

    goose run --no-session -i - --provider <anthropic|openai> --model <m>
              --output-format json --system <text> --max-turns <max_iterations>
              --no-profile [--with-extension "<ENV=value ...> <gateway command>"]

The prompt goes on stdin (``-i -``). Goose splits ``--with-extension`` on whitespace
and takes leading ``KEY=value`` words as the extension's environment, so the
gateway's block (no secrets, compact JSON) goes there. ``GOOSE_MODE=auto`` lets it
call the gateway's tools without asking; it gets no built-in extension.
The output is ``{"messages": [...], "metadata": {"total_tokens", "status", ...}}``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from worker.exceptions import ExecutorError
from worker.executors._cli import CliExecutor
from worker.executors._cli_job import CliInvocation, CliJob
from worker.executors._process import ProcessOutcome
from worker.executors._transcript import CliTranscript, CliTurn
from worker.models import Usage
from worker.task import Outcome


class GooseExecutor(CliExecutor):
    name = "goose"
    binary = "goose"
    install_command = (
        "curl -fsSL https://github.com/block/goose/releases/download/stable/download_cli.sh"
        " | CONFIGURE=false bash"
    )

    def invocation(self, job: CliJob) -> CliInvocation:
        access = job.access
        argv = [
            job.executable,
            "run",
            "--no-session",
            "-i",
            "-",
            "--provider",
            access.provider,
            "--model",
            access.model,
            "--output-format",
            "json",
            "--system",
            job.system,
            "--max-turns",
            str(job.max_turns),
            "--no-profile",
        ]
        if job.gateway is not None:
            argv += ["--with-extension", _extension_command(job)]
        env = {"GOOSE_MODE": "auto", "GOOSE_DISABLE_KEYRING": "1"}
        if access.provider == "anthropic":
            env["ANTHROPIC_API_KEY"] = access.api_key
            if access.base_url:
                env["ANTHROPIC_HOST"] = access.anthropic_base_url
        else:
            base = urlsplit(access.openai_base_url)
            env["OPENAI_API_KEY"] = access.api_key
            env["OPENAI_HOST"] = f"{base.scheme}://{base.netloc}"
            env["OPENAI_BASE_PATH"] = f"{base.path.strip('/')}/chat/completions".lstrip("/")
        return CliInvocation(argv=argv, env=env, stdin=job.prompt.encode("utf-8"))

    def parse(self, job: CliJob, output: ProcessOutcome) -> CliTranscript:
        document = _document(output.stdout)
        messages = document.get("messages")
        metadata = document.get("metadata")
        if not isinstance(messages, list) or not isinstance(metadata, dict):
            raise ExecutorError("goose printed JSON without `messages` and `metadata`")
        turns = [
            CliTurn(text=_text(message), tool_requests=_tool_requests(message))
            for message in messages
            if isinstance(message, dict) and message.get("role") == "assistant"
        ]
        answer = turns[-1].text if turns else ""
        transcript = CliTranscript(output=answer, turns=turns, usage=_usage(metadata))
        if metadata.get("status") == "error":
            raise ExecutorError(f"goose reported status error (last text: {answer[:200]!r})")
        if turns and turns[-1].tool_requests and len(turns) >= job.max_turns:
            transcript.outcome = Outcome.MAX_ITERATIONS
            transcript.output = next((t.text for t in reversed(turns) if t.text.strip()), "")
            transcript.detail = (
                f"max_iterations reached: goose stopped after {len(turns)} turns "
                f"(--max-turns {job.max_turns})"
            )
        return transcript


def _extension_command(job: CliJob) -> str:
    assert job.gateway is not None
    words = [f"{key}={value}" for key, value in job.gateway.env.items()] + job.gateway.command
    for word in words:
        if not word or any(character.isspace() for character in word):
            raise ExecutorError(
                "goose splits --with-extension on whitespace, and the gateway needs the value "
                f"{word.split('=', 1)[0]!r} with whitespace in it; move the worker to a path "
                "without spaces"
            )
    return " ".join(words)


def _document(stdout: bytes) -> dict[str, Any]:
    text = stdout.decode("utf-8", "replace").strip()
    start = text.find("{")
    try:
        value = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ExecutorError(
            f"goose printed no JSON document on stdout (got: {text[:200] or 'nothing'})"
        )
    return value


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return (
        [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []
    )


def _text(message: dict[str, Any]) -> str:
    return "".join(
        str(block.get("text", "")) for block in _content(message) if block.get("type") == "text"
    )


def _tool_requests(message: dict[str, Any]) -> int:
    return sum(1 for block in _content(message) if block.get("type") == "toolRequest")


def _usage(metadata: dict[str, Any]) -> Usage:
    def count(name: str) -> int:
        value = metadata.get(name)
        return value if isinstance(value, int) and value >= 0 else 0

    input_tokens, output_tokens = count("input_tokens"), count("output_tokens")
    if not input_tokens and not output_tokens:
        # Older goose reports only the total: count it as input, the larger share.
        input_tokens = count("total_tokens")
    cost = metadata.get("cost_usd")
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
    )

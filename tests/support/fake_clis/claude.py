"""Fake ``claude`` (Claude Code 2.1.x): print mode, JSON result, MCP servers from --mcp-config.

Flags: every option of ``claude --help`` 2.1.197, plus three that
work but are unlisted (--max-turns, --system-prompt-file, --append-system-prompt-file).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.support.fake_clis._common import Arity, Fake, FlagError

FLAGS: dict[str, Arity] = {
    **dict.fromkeys(
        [
            "--allow-dangerously-skip-permissions",
            "--ax-screen-reader",
            "--bg",
            "--background",
            "--bare",
            "--brief",
            "--chrome",
            "-c",
            "--continue",
            "--dangerously-skip-permissions",
            "--disable-slash-commands",
            "--exclude-dynamic-system-prompt-sections",
            "--fork-session",
            "-h",
            "--help",
            "--ide",
            "--include-hook-events",
            "--include-partial-messages",
            "--no-chrome",
            "--no-session-persistence",
            "-p",
            "--print",
            "--replay-user-messages",
            "--safe-mode",
            "--strict-mcp-config",
            "--tmux",
            "--verbose",
            "-v",
            "--version",
        ],
        "none",
    ),
    **dict.fromkeys(
        [
            "-d",
            "--debug",
            "--from-pr",
            "--prompt-suggestions",
            "--remote-control",
            "-r",
            "--resume",
            "-w",
            "--worktree",
        ],
        "optional",
    ),
    **dict.fromkeys(
        [
            "--agent",
            "--agents",
            "--append-system-prompt",
            "--debug-file",
            "--effort",
            "--fallback-model",
            "--input-format",
            "--json-schema",
            "--max-budget-usd",
            "--model",
            "-n",
            "--name",
            "--output-format",
            "--permission-mode",
            "--plugin-dir",
            "--plugin-url",
            "--remote-control-session-name-prefix",
            "--session-id",
            "--setting-sources",
            "--settings",
            "--system-prompt",
            "--max-turns",
            "--system-prompt-file",
            "--append-system-prompt-file",
        ],
        "one",
    ),
    **dict.fromkeys(
        [
            "--add-dir",
            "--allowedTools",
            "--allowed-tools",
            "--betas",
            "--disallowedTools",
            "--disallowed-tools",
            "--file",
            "--mcp-config",
            "--tools",
        ],
        "variadic",
    ),
}
OUTPUT_FORMATS = ("text", "json", "stream-json")


def main() -> int:
    fake = Fake("claude")
    try:
        args = fake.parse(sys.argv[1:], FLAGS)
    except FlagError as exc:
        return fake.fail(str(exc))
    if args.has("--version") or args.has("-v"):
        print("2.1.197 (Claude Code)")
        return 0
    if not (args.has("-p") or args.has("--print")):
        return fake.fail("this fake only runs in print mode (-p)")
    output_format = args.value("--output-format") or "text"
    if output_format not in OUTPUT_FORMATS:
        return fake.fail(f"option '--output-format' argument '{output_format}' is invalid")
    for flag in ("--system-prompt-file", "--append-system-prompt-file"):
        if args.value(flag):
            fake.remember_file(args.value(flag) or "")
    prompt = " ".join(args.positionals) or fake.read_stdin()
    if not prompt.strip():
        return fake.fail("Input must be provided either through stdin or as a prompt argument")
    servers = _mcp_servers(fake, args.values("--mcp-config"))
    exit_code = fake.act_out()
    if exit_code is not None:
        return exit_code
    tool_results = []
    if "gateway" in servers and fake.scenario.get("tool_calls"):
        server = servers["gateway"]
        tool_results = fake.call_gateway(
            [server["command"], *server.get("args", [])], dict(server.get("env", {}))
        )
    result: dict[str, Any] = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "api_error_status": None,
        "duration_ms": 12,
        "num_turns": len(tool_results) + 1,
        "result": "fake claude answer",
        "stop_reason": "end_turn",
        "session_id": "00000000-0000-0000-0000-000000000000",
        "total_cost_usd": 0.0123,
        "usage": {
            "input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "cache_read_input_tokens": 30,
            "output_tokens": 40,
        },
        "modelUsage": {},
        "permission_denials": [],
        "terminal_reason": "completed",
    }
    result.update(fake.scenario.get("result", {}))
    print(json.dumps(result))
    return 1 if result["is_error"] else 0


def _mcp_servers(fake: Fake, configs: list[str]) -> dict[str, Any]:
    servers: dict[str, Any] = {}
    for config in configs:
        text = config if config.lstrip().startswith("{") else fake.remember_file(config)
        servers.update(json.loads(text).get("mcpServers", {}))
    if servers:
        fake.record["mcp_servers"] = servers
        fake.save()
    return servers

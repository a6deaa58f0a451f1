"""What every fake CLI does: strict flag parsing, scenario, record, gateway tool calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# none: a switch; one: takes the next argument; optional: takes it unless it is a flag;
# variadic: takes every following argument up to the next flag (commander's <x...>).
Arity = Literal["none", "one", "optional", "variadic"]


class FlagError(Exception):
    pass


@dataclass
class Parsed:
    options: dict[str, list[str]] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.options

    def value(self, name: str) -> str | None:
        values = self.options.get(name)
        return values[-1] if values else None

    def values(self, name: str) -> list[str]:
        return self.options.get(name, [])


def parse_flags(argv: list[str], flags: dict[str, Arity]) -> Parsed:
    """Parse like the real CLI, but fail on any flag the real CLI does not have."""
    parsed = Parsed()
    index = 0
    while index < len(argv):
        argument = argv[index]
        if argument == "--":
            parsed.positionals.extend(argv[index + 1 :])
            break
        if not argument.startswith("-") or argument == "-":
            parsed.positionals.append(argument)
            index += 1
            continue
        name, has_inline, inline = argument.partition("=")
        arity = flags.get(name)
        if arity is None:
            raise FlagError(f"unknown option '{name}'")
        collected = parsed.options.setdefault(name, [])
        if arity == "none":
            if has_inline:
                raise FlagError(f"option '{name}' takes no value")
            collected.append("")
        elif has_inline:
            collected.append(inline)
        elif arity == "one":
            index += 1
            if index >= len(argv):
                raise FlagError(f"option '{name}' argument missing")
            collected.append(argv[index])
        elif arity == "optional":
            if index + 1 < len(argv) and not argv[index + 1].startswith("-"):
                index += 1
                collected.append(argv[index])
            else:
                collected.append("")
        else:
            taken = 0
            while index + 1 < len(argv) and not argv[index + 1].startswith("-"):
                index += 1
                collected.append(argv[index])
                taken += 1
            if taken == 0:
                raise FlagError(f"option '{name}' argument missing")
        index += 1
    return parsed


class Fake:
    """One run of a fake CLI: its scenario in, its record out."""

    def __init__(self, name: str) -> None:
        executable = Path(sys.argv[0])
        self.name = name
        self.scenario: dict[str, Any] = {}
        scenario_path = executable.with_name(f"{executable.name}.scenario.json")
        if scenario_path.exists():
            self.scenario = json.loads(scenario_path.read_text())
        self.record_path = executable.with_name(f"{executable.name}.record.json")
        self.record: dict[str, Any] = {
            "argv": sys.argv[1:],
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "files": {},
        }
        self.save()

    def save(self) -> None:
        self.record_path.write_text(json.dumps(self.record))

    def remember_file(self, path: str) -> str:
        """Keep a file a flag names (the executor deletes them after the run)."""
        text = Path(path).read_text(encoding="utf-8")
        self.record["files"][path] = text
        self.save()
        return text

    def read_stdin(self) -> str:
        text = sys.stdin.read()
        self.record["stdin"] = text
        self.save()
        return text

    def fail(self, message: str, code: int = 1) -> int:
        self.record["failed"] = message
        self.save()
        print(f"error: {message}", file=sys.stderr)
        return code

    def parse(self, argv: list[str], flags: dict[str, Arity]) -> Parsed:
        parsed = parse_flags(argv, flags)
        self.record["options"] = parsed.options
        self.record["positionals"] = parsed.positionals
        self.save()
        return parsed

    def act_out(self) -> int | None:
        """The scenario's side effects: a grandchild, a wait, raw output. An exit code ends it."""
        if self.scenario.get("spawn_grandchild"):
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(600)"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.record["grandchild_pid"] = child.pid
            self.save()
        if self.scenario.get("sleep_s"):
            time.sleep(float(self.scenario["sleep_s"]))
        if "stderr" in self.scenario:
            sys.stderr.write(self.scenario["stderr"])
        if "stdout" in self.scenario:
            sys.stdout.write(self.scenario["stdout"])
            return int(self.scenario.get("exit_code", 0))
        if self.scenario.get("exit_code"):
            return int(self.scenario["exit_code"])
        return None

    def call_gateway(self, command: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
        """Start the MCP server the CLI was configured with, as the CLI would, and make the
        scenario's ``tool_calls`` through a real MCP client session."""
        import anyio
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        calls = self.scenario.get("tool_calls", [])
        results: list[dict[str, Any]] = []

        async def session() -> None:
            parameters = StdioServerParameters(command=command[0], args=command[1:], env=env)
            async with (
                stdio_client(parameters) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                listed = await client.list_tools()
                self.record["gateway_tools"] = sorted(tool.name for tool in listed.tools)
                for call in calls:
                    result = await client.call_tool(call["name"], call.get("arguments", {}))
                    text = "".join(getattr(block, "text", "") for block in result.content)
                    results.append(
                        {"name": call["name"], "is_error": result.is_error, "text": text}
                    )

        anyio.run(session)
        self.record["tool_results"] = results
        self.save()
        return results

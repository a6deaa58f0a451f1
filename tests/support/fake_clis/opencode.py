"""Fake ``opencode`` (1.18.x): ``opencode run --format json``, one JSON event per line.

Flags: every option of ``opencode run --help`` 1.18.33. Configuration comes only from
``OPENCODE_CONFIG_CONTENT`` (the HOME the executor gives it is empty); ``{env:VAR}``
references must resolve, as they must for the real CLI.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from tests.support.fake_clis._common import Arity, Fake, FlagError

FLAGS: dict[str, Arity] = {
    **dict.fromkeys(
        [
            "-h",
            "--help",
            "-v",
            "--version",
            "--print-logs",
            "--pure",
            "-c",
            "--continue",
            "--fork",
            "--share",
            "--thinking",
            "-i",
            "--interactive",
            "--auto",
        ],
        "none",
    ),
    **dict.fromkeys(
        [
            "--log-level",
            "--command",
            "-s",
            "--session",
            "-m",
            "--model",
            "--agent",
            "--format",
            "-f",
            "--file",
            "--attach",
            "-p",
            "--password",
            "-u",
            "--username",
            "--dir",
            "--variant",
        ],
        "one",
    ),
    **dict.fromkeys(["--title", "--port"], "optional"),
}
_ENV_REFERENCE = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def main() -> int:
    fake = Fake("opencode")
    if sys.argv[1:] in (["--version"], ["-v"]):
        print("1.18.33")
        return 0
    if sys.argv[1:2] != ["run"]:
        return fake.fail("this fake only implements `opencode run`")
    try:
        args = fake.parse(sys.argv[2:], FLAGS)
    except FlagError as exc:
        return fake.fail(str(exc))
    if (args.value("--format") or "default") not in ("default", "json"):
        return fake.fail("Invalid values: Argument: format")
    config_text = os.environ.get("OPENCODE_CONFIG_CONTENT", "{}")
    for variable in _ENV_REFERENCE.findall(config_text):
        if variable not in os.environ:
            return fake.fail(f"config references {{env:{variable}}}, which is not set")
    config = json.loads(config_text)
    fake.record["config"] = config
    message = " ".join(args.positionals) or fake.read_stdin()
    if not message.strip():
        return fake.fail("You must provide a message or a command")
    exit_code = fake.act_out()
    if exit_code is not None:
        return exit_code
    gateway = config.get("mcp", {}).get("gateway")
    tool_results = []
    if gateway is not None and fake.scenario.get("tool_calls"):
        tool_results = fake.call_gateway(gateway["command"], dict(gateway.get("environment", {})))
    events = fake.scenario.get("events") or _events(fake.scenario, tool_results)
    for event in events:
        print(json.dumps(event), flush=True)
    if fake.scenario.get("hang_after_output_s"):
        time.sleep(float(fake.scenario["hang_after_output_s"]))  # a run that never ends
    return 1 if any(event.get("type") == "error" for event in events) else 0


def _events(scenario: dict[str, Any], tool_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    session = {"timestamp": 1795328759243, "sessionID": "ses_fake"}
    events: list[dict[str, Any]] = []
    tokens = scenario.get(
        "tokens", {"input": 50, "output": 10, "reasoning": 2, "cache": {"read": 5, "write": 0}}
    )
    cost = scenario.get("cost", 0.004)

    def step(parts: list[dict[str, Any]]) -> None:
        events.append({"type": "step_start", **session, "part": {"type": "step-start"}})
        events.extend(parts)
        events.append(
            {
                "type": "step_finish",
                **session,
                "part": {"type": "step-finish", "reason": "stop", "tokens": tokens, "cost": cost},
            }
        )

    for result in tool_results:
        step(
            [
                {
                    "type": "tool_use",
                    **session,
                    "part": {
                        "type": "tool",
                        "tool": f"gateway_{result['name']}",
                        "state": {"status": "completed", "output": result["text"]},
                    },
                }
            ]
        )
    step(
        [
            {"type": "text", **session, "part": {"type": "text", "text": text}}
            for text in scenario.get("texts", ["fake ", "opencode answer"])
        ]
    )
    return events

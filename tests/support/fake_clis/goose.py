"""Fake ``goose``: ``goose run`` with ``--output-format json``.

Goose is not installed on the machines these tests run on; the flags are those of
``goose run`` in its documentation and source (--no-profile included).
Like goose, it splits ``--with-extension`` on whitespace and takes leading
``KEY=value`` words as the extension's environment.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.support.fake_clis._common import Arity, Fake, FlagError

FLAGS: dict[str, Arity] = {
    **dict.fromkeys(
        [
            "-s",
            "--interactive",
            "-r",
            "--resume",
            "--no-session",
            "--debug",
            "--explain",
            "--render-recipe",
            "-q",
            "--quiet",
            "--no-profile",
            "-h",
            "--help",
        ],
        "none",
    ),
    **dict.fromkeys(
        [
            "-i",
            "--instructions",
            "-t",
            "--text",
            "--system",
            "--recipe",
            "--params",
            "--sub-recipe",
            "-n",
            "--name",
            "--path",
            "--with-extension",
            "--with-streamable-http-extension",
            "--with-remote-extension",
            "--with-builtin",
            "--max-tool-repetitions",
            "--max-turns",
            "--output-format",
            "--provider",
            "--model",
        ],
        "one",
    ),
}


def main() -> int:
    fake = Fake("goose")
    if sys.argv[1:] in (["--version"], ["-V"]):
        print("1.14.0")
        return 0
    if sys.argv[1:2] != ["run"]:
        return fake.fail("this fake only implements `goose run`")
    try:
        args = fake.parse(sys.argv[2:], FLAGS)
    except FlagError as exc:
        return fake.fail(str(exc), code=2)
    if args.positionals:
        return fake.fail(f"unexpected argument '{args.positionals[0]}' found", code=2)
    if (args.value("--output-format") or "text") not in ("text", "json", "stream-json"):
        return fake.fail("invalid value for '--output-format'", code=2)
    if args.has("-i") == args.has("-t"):
        return fake.fail("give exactly one of --instructions or --text", code=2)
    prompt = fake.read_stdin() if args.value("-i") == "-" else args.value("-t") or ""
    if not prompt.strip():
        return fake.fail("no instructions")
    exit_code = fake.act_out()
    if exit_code is not None:
        return exit_code
    tool_results: list[dict[str, Any]] = []
    for extension in args.values("--with-extension"):
        words = extension.split()
        env = {}
        while words and "=" in words[0]:
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if fake.scenario.get("tool_calls"):
            tool_results = fake.call_gateway(words, env)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": prompt}]}
    ]
    for result in tool_results:
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "toolRequest", "id": result["name"], "toolCall": {"status": "success"}}
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "toolResponse",
                        "id": result["name"],
                        "toolResult": {"status": "success"},
                    }
                ],
            }
        )
    for text in fake.scenario.get("assistant_texts", ["fake goose answer"]):
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    metadata = {
        "total_tokens": 321,
        "input_tokens": 300,
        "output_tokens": 21,
        "status": "completed",
    }
    metadata.update(fake.scenario.get("metadata", {}))
    print(json.dumps({"messages": messages, "metadata": metadata}, indent=2))
    return 0

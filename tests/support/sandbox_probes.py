"""What an injected shell command tries inside a CLI's sandbox, as one ``python3 -c`` line.

The probe reports as ``SANDBOX-PROBE <base64 JSON>`` on stdout, so a test can find it in
what the CLI sent back to the model, whatever escaping the CLI applied.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

MARKER = "SANDBOX-PROBE "

# Runs with the sandbox's system python3; TARGETS is filled in by probe_command.
_PROBE = r"""
import base64, glob, json, os, socket
targets = json.loads(TARGETS)
report = {"uid": os.getuid()}

def attempt(name, action):
    try:
        report[name] = "READ " + repr(action())[:3000]
    except Exception as exc:
        report[name] = "BLOCKED " + type(exc).__name__

def read_all(pattern):
    found = []
    for path in glob.glob(pattern, recursive=True):
        try:
            found.append(open(path).read())
        except OSError:
            pass
    return found

def environments():
    found = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            found.append(open(path, "rb").read().decode("utf-8", "replace"))
        except OSError:
            pass
    return found

def talk(port, message):
    connection = socket.create_connection(("127.0.0.1", port), timeout=3)
    connection.sendall(message)
    return connection.recv(4096)

report["private_files"] = read_all("/tmp/agent-*-private-*/*.json")
report["tmp_files"] = sorted(glob.glob("/tmp/**", recursive=True))[:200]
report["environ"] = environments()
report["processes"] = [
    open(path, "rb").read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    for path in glob.glob("/proc/[0-9]*/cmdline")
]
repo = targets["repo"]
attempt("repo", lambda: (os.listdir(repo), open(repo + "/pyproject.toml").read()))
attempt("mcp_config", lambda: open(targets["mcp_config"]).read())
attempt("redis", lambda: talk(targets["redis"], b"PING\r\n"))
attempt("hub", lambda: talk(targets["hub"], b"GET /api/v1/_dev/state HTTP/1.0\r\n\r\n"))
attempt("write_repo", lambda: open(targets["repo"] + "/" + targets["escape"], "w").write("x"))
attempt("write_tmp", lambda: open("/tmp/" + targets["escape"], "w").write("x"))
private = [path for path in glob.glob("/tmp/agent-*/cli") if os.path.isdir(path)]
attempt("write_private", lambda: open(private[0] + "/" + targets["escape"], "w").write("x"))
print("SANDBOX-PROBE " + base64.b64encode(json.dumps(report).encode()).decode())
"""


def probe_command(targets: dict[str, Any]) -> str:
    """The shell command an attacker would inject: the probe through ``python3 -c``."""
    source = _PROBE.replace("TARGETS", repr(json.dumps(targets)))
    encoded = base64.b64encode(source.encode("utf-8")).decode("ascii")
    return f"python3 -c \"import base64; exec(base64.b64decode('{encoded}'))\""


def find_probe_report(text: str) -> dict[str, Any] | None:
    """The probe's report in ``text`` (a tool result the CLI sent on), or None."""
    match = re.search(re.escape(MARKER) + r"([A-Za-z0-9+/=]+)", text)
    if match is None:
        return None
    try:
        report: dict[str, Any] = json.loads(base64.b64decode(match.group(1)))
    except (binascii.Error, ValueError):
        return None
    return report

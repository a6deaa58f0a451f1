"""What an injected shell command tries inside a CLI's sandbox, as one ``python3 -c`` line.

The probe reports as ``SANDBOX-PROBE <base64 of zlib-compressed JSON>`` on stdout, so a test
can find it in what the CLI sent back to the model, whatever escaping the CLI applied
(compressed: Claude Code sets aside a tool output over 30,000 characters).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from typing import Any

MARKER = "SANDBOX-PROBE "

# Runs with the sandbox's system python3; TARGETS is filled in by probe_command.
_PROBE = r"""
import base64, glob, json, os, socket, zlib
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
if targets.get("beside_cli"):
    attempt("beside_cli", lambda: os.listdir(targets["beside_cli"]))
# What tool servers write under their HOME (npm's debug logs hold their argv).
report["server_home_files"] = [
    path for path in glob.glob("/tmp/**/*", recursive=True)
    if "/gateway-home" in path or "/.npm/" in path or path.endswith("debug-0.log")
]
report["mountinfo"] = open("/proc/self/mountinfo").read()
report["seccomp"] = [line for line in open("/proc/self/status") if line.startswith("Seccomp")]

def nested_user_namespace():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:  # in a child: a success would change this process's namespace
        os._exit(0 if libc.unshare(0x10000000) == 0 else 10 + ctypes.get_errno())
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

attempt("userns", nested_user_namespace)
attempt("ptrace", lambda: __import__("ctypes").CDLL(None, use_errno=True).ptrace(16, 1, 0, 0))

def fill(directory, limit_mb):
    # 4 MiB files (under any file-size limit) until the filesystem refuses one.
    written = 0
    try:
        for index in range(limit_mb // 4):
            with open(os.path.join(directory, "fill-%d" % index), "wb") as file:
                for _ in range(4):
                    file.write(b"x" * 1048576)
                    file.flush()
                    written += 1
        return "FILLED %d MiB" % written
    except OSError as exc:
        return "REFUSED %s after %d MiB" % (__import__("errno").errorcode[exc.errno], written)
    finally:
        for path in glob.glob(os.path.join(directory, "fill-*")):
            os.remove(path)

if targets.get("fill_mb"):
    report["fill"] = {where: fill(where, targets["fill_mb"]) for where in ("/tmp", "/dev/shm", ".")}
for name, path in (("write_root", "/probe"), ("write_dev", "/dev/probe")):
    attempt(name, lambda path=path: open(path, "w").write("x"))

def key_sightings(needle):
    # The provider key in any environment, any file the sandbox can write to or read
    # from its run, and the readable anonymous memory of every process it can see.
    found = []
    def look(data, where):
        if needle in data:
            found.append(where)
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            look(open(path, "rb").read(), path)
        except OSError:
            pass
    for root in ("/tmp", "/dev/shm", os.environ.get("HOME", "/tmp")):
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                try:
                    with open(path, "rb") as file:
                        look(file.read(64 * 1048576), path)
                except OSError:
                    pass
    scanned = 0
    scanned_of = []
    for maps in glob.glob("/proc/[0-9]*/maps"):
        if maps == "/proc/%d/maps" % os.getpid():
            continue  # the probe's own memory holds the needle
        memory_path = maps[: -len("maps")] + "mem"
        try:
            regions = open(maps).read().splitlines()
            memory = open(memory_path, "rb")
        except OSError:
            continue
        with memory:
            try:
                scanned_of.append(open(maps[: -len("maps")] + "comm").read().strip())
            except OSError:
                pass
            for region in regions:
                fields = region.split()
                if not fields[1].startswith("r") or (len(fields) > 5 and fields[5].startswith("/")):
                    continue
                start, end = (int(value, 16) for value in fields[0].split("-"))
                if end - start > 512 * 1048576 or scanned > 4096 * 1048576:
                    continue
                try:
                    memory.seek(start)
                    look(memory.read(end - start), memory_path)
                    scanned += end - start
                except (OSError, OverflowError, ValueError):
                    pass
    report["memory_scanned_mb"] = scanned // 1048576
    report["memory_scanned_of"] = scanned_of
    return sorted(set(found))

if targets.get("key_prefix_reversed"):  # reversed: the probe's source must not match
    report["key_sightings"] = key_sightings(targets["key_prefix_reversed"][::-1].encode())
print("SANDBOX-PROBE " + base64.b64encode(zlib.compress(json.dumps(report).encode(), 9)).decode())
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
        report: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(match.group(1))))
    except (binascii.Error, ValueError, zlib.error):
        return None
    return report


def assert_sandbox_bounds(probe: dict[str, Any], *, beside_cli: str) -> None:
    """What the probe found of the sandbox's bounds (its second pass), each one held."""
    # The gateway's servers keep their HOME outside: nothing of it is inside.
    assert probe["server_home_files"] == [], probe["server_home_files"]
    # Only the CLI's own install is mounted, not the directory it was found in.
    assert probe["beside_cli"].startswith("BLOCKED"), probe["beside_cli"]
    # The provider key: in no environment, file or memory the sandbox can read.
    assert probe["key_sightings"] == [] and probe["memory_scanned_mb"] > 0, probe["key_sightings"]
    # Bounded writable space: / and /dev read-only, each tmpfs refuses past its size.
    assert probe["write_root"].startswith("BLOCKED") and probe["write_dev"].startswith("BLOCKED")
    for where, filled in probe["fill"].items():
        assert filled.startswith("REFUSED ENOSPC"), (where, filled)
    # No nested user namespace, a seccomp filter (ptrace refused), no host paths in mountinfo.
    assert probe["userns"] != "READ 0" and probe["ptrace"] == "READ -1", probe["userns"]
    assert probe["seccomp"][0].split() == ["Seccomp:", "2"]
    for line in probe["mountinfo"].splitlines():
        fields = line.split()
        root, mount_point, source = fields[3], fields[4], fields[fields.index("-") + 1]
        # A bind mount shows the path it came from: only ever the same path, or a device.
        pseudo = source in ("devtmpfs", "proc", "devpts", "tmpfs")
        assert root in ("/", mount_point) or mount_point == "/" or pseudo, line
    assert beside_cli not in probe["mountinfo"]

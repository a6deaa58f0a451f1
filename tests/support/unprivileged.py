"""Run a function in a forked child that cannot read what its user may not: for tests of a
directory the process lacks permission for.

Root reads every file whatever its mode, and the virtualenv's interpreter may live where
another user cannot start it (under /root), so a subprocess as ``nobody`` is no option:
the child is a fork of the test process (everything already imported) that drops to
``nobody`` when it runs as root, then calls ``function``. What it writes on stdout and
stderr, and its exit status (``SystemExit``'s code, 0 after a normal return, 70 after an
exception, its traceback on stderr), come back; a return value that is an int is the
status, as a command's ``main`` returns it. The child may not read the interpreter's own
files either: import (or look up) first what ``function`` would load lazily.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

NOBODY = 65534
_UNCAUGHT = 70


@dataclass(frozen=True)
class ChildRun:
    status: int
    output: str


def call_unprivileged(function: Callable[[], object]) -> ChildRun:
    """``function()`` in a forked child without root's permissions; its status and output."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = _UNCAUGHT
        try:
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            # pytest's capture replaced the streams: write to the pipe itself.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            returned = function()
            status = returned if isinstance(returned, int) else 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    _, wait_status = os.waitpid(pid, 0)
    return ChildRun(os.waitstatus_to_exitcode(wait_status), b"".join(chunks).decode())

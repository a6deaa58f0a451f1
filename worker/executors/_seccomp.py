"""The seccomp filter of a CLI's sandbox: system calls a coding-agent CLI never needs.

Each answers ``EPERM`` (a program that probes for one falls back, as node's libuv does
for io_uring); everything else is allowed. bwrap loads the compiled program
(``--seccomp FD``) into the sandbox's first process, and every process inherits it.

- other processes' memory and tracing: ``ptrace``, ``process_vm_readv``/``writev``,
  ``kcmp``, ``pidfd_getfd``;
- the kernel's attack surface: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_*``, the kernel keyring (``keyctl``, ``add_key``, ``request_key``);
- namespaces and mounts: ``unshare``, ``setns``, ``mount``, ``umount2``, ``pivot_root``,
  ``chroot``, ``open_by_handle_at``, the new mount API (``fsopen``, ``fsmount``, …);
- the host: modules, ``kexec_*``, ``reboot``, ``swapon``/``swapoff``, ``acct``,
  ``syslog``, clock and host name changes, ``quotactl``, ``personality``;
- terminal injection: ``ioctl(TIOCSTI)`` (typing into the terminal the worker runs in).

The program is built with libseccomp (through ``pyseccomp``, its ctypes bindings), which
knows each architecture's system call numbers; the worker fails closed without it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from worker.exceptions import ExecutorError

DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "quotactl",
    "personality",
    "lookup_dcookie",
    "fanotify_init",
)
# ioctl(fd, TIOCSTI, ...): push characters into a terminal's input.
TIOCSTI = 0x5412


@lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The compiled BPF program; ExecutorError when libseccomp is missing (fail closed)."""
    try:
        import pyseccomp
    except (ImportError, OSError) as exc:
        raise ExecutorError(
            "CLI sandbox unavailable: libseccomp is missing for its seccomp filter "
            f"(apt-get install libseccomp2; {exc})"
        ) from None
    program = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    denied = pyseccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            program.add_rule(denied, name)
        except (ValueError, RuntimeError):
            continue  # not a system call on this architecture
    # The request is an unsigned 32-bit value: only its low half is compared.
    program.add_rule(denied, "ioctl", pyseccomp.Arg(1, pyseccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    # libseccomp writes to a file descriptor: a memory file's, read back whole.
    with os.fdopen(os.memfd_create("agent-sandbox-seccomp-export", 0), "w+b") as file:
        program.export_bpf(file)
        file.seek(0)
        return file.read()


@contextmanager
def seccomp_descriptor() -> Iterator[int]:
    """A file descriptor holding the program, at its start, for ``bwrap --seccomp FD``."""
    descriptor = os.memfd_create("agent-sandbox-seccomp", 0)
    try:
        os.write(descriptor, seccomp_program())
        os.lseek(descriptor, 0, os.SEEK_SET)
        yield descriptor
    finally:
        os.close(descriptor)

"""The seccomp filter handed to bwrap (`--seccomp FD`): no network, no kernel escapes.

Everything is allowed except: sockets other than AF_UNIX (no AF_INET/AF_INET6/AF_NETLINK/
AF_PACKET/...), new namespaces (unshare, setns, clone with CLONE_NEW*), and syscalls a
model never needs but an escape would: ptrace, bpf, mount family, keyctl, perf_event_open,
userfaultfd, io_uring (it runs syscalls the filter never sees), kernel modules, kexec.
"""

from __future__ import annotations

import errno
import os
from functools import lru_cache

__all__ = ["seccomp_bpf", "seccomp_fd", "BLOCKED_SYSCALLS", "ZYGOTE_ALLOWED"]

AF_UNIX = 1
# clone(2) flags that create namespaces.
CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
BLOCKED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open",
    "userfaultfd", "keyctl", "add_key", "request_key", "unshare", "setns",
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at",
    "open_by_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog", "lookup_dcookie",
)  # fmt: skip


# What the zygote itself may still do: its forked children make their namespaces and
# mounts, then install the whole filter on top (filters stack: the strictest answer wins).
ZYGOTE_ALLOWED = ("unshare", "mount", "umount2")


def _build(zygote: bool = False):  # noqa: ANN202 - pyseccomp.SyscallFilter
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in BLOCKED_SYSCALLS:
        if zygote and name in ZYGOTE_ALLOWED:
            continue
        try:
            flt.add_rule(deny, name)
        except (ValueError, OSError):  # unknown on this architecture
            continue
    flt.add_rule(sc.ERRNO(errno.EACCES), "socket", sc.Arg(0, sc.NE, AF_UNIX))
    for flag in CLONE_NEW_FLAGS:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory the filter cannot read: make libc fall back to clone.
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    return flt


@lru_cache(maxsize=2)
def seccomp_bpf(zygote: bool = False) -> bytes:
    """The compiled BPF program (raises ImportError/OSError when libseccomp is missing);
    `zygote`: the zygote's, which lets its children set themselves up."""
    flt = _build(zygote)
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb", closefd=True) as out:
            flt.export_bpf(out)
        with os.fdopen(read, "rb", closefd=False) as src:
            return src.read()
    finally:
        os.close(read)


def seccomp_fd(zygote: bool = False) -> int:
    """A fresh readable fd holding the BPF program, for `bwrap --seccomp FD`."""
    data = seccomp_bpf(zygote)
    fd = os.memfd_create("inspector-seccomp", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

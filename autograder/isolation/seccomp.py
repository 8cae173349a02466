"""The sandbox's seccomp filter: system calls learner code never needs fail with EPERM.

bubblewrap loads it (``bwrap --seccomp FD``) just before it runs the worker, after the
namespaces are set up and before `setpriv` drops to the sandbox uid, so every process of
the worker (and all it forks, threads included) carries it; it cannot be removed.

The filter is a classic-BPF program (an array of ``struct sock_filter {u16 code; u8 jt;
u8 jf; u32 k}``) run by the kernel on every system call against ``struct seccomp_data
{int nr; u32 arch; u64 instruction_pointer; u64 args[6]}``. It is built here with
`struct`, from system-call tables hard-coded below (the grader needs no kernel headers,
nor libseccomp, at run time; `tests/isolation/test_sandbox.py` checks the x86_64 table against
``/usr/include/x86_64-linux-gnu/asm/unistd_64.h`` where that header exists).

What it does, in order:

1. ``seccomp_data.arch`` must be x86_64 or aarch64, else the process is killed (a 32-bit
   ``int 0x80`` call on x86_64 arrives as i386, with other numbers: nothing would match).
   On x86_64 the x32 ABI (``nr >= 0x40000000``) is denied.
2. ``clone3`` fails with ENOSYS: its flags live in memory the filter cannot read, and glibc
   (threads, ``posix_spawn``) then falls back to ``clone``, whose flags it can.
3. ``clone`` with any CLONE_NEW* bit in its flags (args[0], low 32 bits, as the kernel
   reads them) fails with EPERM; a plain fork, vfork or thread is allowed.
4. ``personality`` is allowed only to query (0xffffffff) or to set the default (PER_LINUX, 0).
5. Every call of `BLOCKED` fails with EPERM; everything else is allowed.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# classic BPF (linux/filter.h, linux/bpf_common.h)
BPF_LD, BPF_W, BPF_ABS = 0x00, 0x00, 0x20
BPF_JMP, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_K = 0x05, 0x10, 0x30, 0x40, 0x00
BPF_RET = 0x06
# seccomp return values (linux/seccomp.h)
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# offsets in struct seccomp_data (little-endian: the low word of args[0] comes first)
OFF_NR, OFF_ARCH, OFF_ARG0_LO, OFF_ARG1_LO = 0, 4, 16, 24

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEW_ANY = (CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                 | CLONE_NEWPID | CLONE_NEWNET)
PER_LINUX, PER_QUERY = 0x0, 0xFFFFFFFF
CLONE_PARENT = 0x00008000
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
AF_INET, AF_INET6 = 2, 10

# Blocked families: (why, names). A name missing from an architecture's table (iopl on
# aarch64) simply does not exist there.
BLOCKED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("namespaces: a nested user namespace gives root-in-namespace, mounts of unbounded tmpfs "
     "and the kernel's widest attack surface", ("unshare", "setns")),
    ("mounts: the sandbox's file system is fixed; a mount could hide or bring in files, or "
     "hold memory in a tmpfs", ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
                                "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr")),
    ("keyrings: keys are per uid and per session, not per namespace, so they cross the sandbox "
     "(another submission's or the grader's keys)", ("keyctl", "add_key", "request_key")),
    ("tracing and reading other processes' memory", ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
                                                      "pidfd_getfd", "process_madvise")),
    ("kernel modules and replacing the kernel", ("init_module", "finit_module", "delete_module", "kexec_load",
                                                 "kexec_file_load", "create_module", "get_kernel_syms",
                                                 "query_module", "uselib")),
    ("eBPF, perf and userfaultfd: large kernel attack surface, used to widen exploit races",
     ("bpf", "perf_event_open", "userfaultfd")),
    ("io_uring: a second system-call interface that this filter would not see into",
     ("io_uring_setup", "io_uring_enter", "io_uring_register")),
    ("file handles: open files by handle, around the mount's view", ("open_by_handle_at", "name_to_handle_at")),
    ("host administration: swap, reboot, accounting, quotas, the kernel log",
     ("swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog", "lookup_dcookie", "vhangup",
      "nfsservctl")),
    ("hardware and x86 segment access", ("iopl", "ioperm", "modify_ldt")),
    ("the clock: setting the host's time", ("settimeofday", "clock_settime", "adjtimex", "clock_adjtime")),
)
SPECIAL = {
    "clone": "allowed unless its flags hold a CLONE_NEW* bit (a new namespace): EPERM",
    "clone3": "ENOSYS, so that glibc falls back to clone, whose flags the filter can read",
    "personality": "only PER_LINUX and the query 0xffffffff; other personalities (ADDR_NO_RANDOMIZE...) EPERM",
}

# System-call numbers, from /usr/include/x86_64-linux-gnu/asm/unistd_64.h and
# /usr/include/asm-generic/unistd.h (aarch64 uses the generic table). open_tree_attr (Linux
# 6.15) is newer than those headers: 467 on both, from the kernel's syscall tables.
X86_64: dict[str, int] = {
    "clone": 56, "clone3": 435, "personality": 135,
    "unshare": 272, "setns": 308,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
    "process_madvise": 440,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "create_module": 174, "get_kernel_syms": 177, "query_module": 178, "uselib": 134,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 304, "name_to_handle_at": 303,
    "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179, "quotactl_fd": 443, "syslog": 103,
    "lookup_dcookie": 212, "vhangup": 153, "nfsservctl": 180,
    "iopl": 172, "ioperm": 173, "modify_ldt": 154,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305,
    # the warm start's child filter (`child_program`)
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
    "pidfd_send_signal": 424, "fcntl": 72, "ioctl": 16, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
    "socket": 41,
}
AARCH64: dict[str, int] = {
    "clone": 220, "clone3": 435, "personality": 92,
    "unshare": 97, "setns": 268,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467,
    "keyctl": 219, "add_key": 217, "request_key": 218,
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
    "process_madvise": 440,
    "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
    "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 265, "name_to_handle_at": 264,
    "swapon": 224, "swapoff": 225, "reboot": 142, "acct": 89, "quotactl": 60, "quotactl_fd": 443, "syslog": 116,
    "lookup_dcookie": 18, "vhangup": 58, "nfsservctl": 42,
    "settimeofday": 170, "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266,
    "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_open": 434,
    "pidfd_send_signal": 424, "fcntl": 25, "ioctl": 29, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
    "socket": 198,
}
TABLES = {AUDIT_ARCH_X86_64: X86_64, AUDIT_ARCH_AARCH64: AARCH64}
ARCH_NAMES = {AUDIT_ARCH_X86_64: "x86_64", AUDIT_ARCH_AARCH64: "aarch64"}


def blocked_names() -> list[str]:
    """Every system call that fails with EPERM whatever its arguments, in `BLOCKED` order."""
    return [n for _, names in BLOCKED for n in names]


class _Asm:
    """A tiny classic-BPF assembler with forward labels (jump offsets are 8 bits)."""

    def __init__(self):
        self.code: list[tuple] = []  # (code, jt, jf, k): jt/jf an int or a label name
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        assert name not in self.labels, name
        self.labels[name] = len(self.code)

    def ld(self, offset: int) -> None:
        self.code.append((BPF_LD | BPF_W | BPF_ABS, 0, 0, offset))

    def jump(self, op: int, k: int, jt, jf=0) -> None:
        self.code.append((BPF_JMP | op | BPF_K, jt, jf, k))

    def ret(self, k: int) -> None:
        self.code.append((BPF_RET | BPF_K, 0, 0, k))

    def assemble(self) -> bytes:
        out = bytearray()
        for i, (code, jt, jf, k) in enumerate(self.code):
            offs = []
            for target in (jt, jf):
                if isinstance(target, str):
                    target = self.labels[target] - i - 1
                if not 0 <= target <= 255:
                    raise ValueError(f"BPF jump out of range at instruction {i}")
                offs.append(target)
            out += struct.pack("=HBBI", code, offs[0], offs[1], k & 0xFFFFFFFF)
        return bytes(out)


def _by_arch() -> "_Asm":
    """A program that starts by jumping to label ``arch_<AUDIT_ARCH in hex>`` for each
    architecture we have a table for, and kills the process on any other."""
    a = _Asm()
    a.ld(OFF_ARCH)
    for arch in TABLES:
        a.jump(BPF_JEQ, arch, f"arch_{arch:x}")
    a.ret(SECCOMP_RET_KILL_PROCESS)
    return a


def program(errno_blocked: int = errno.EPERM) -> bytes:
    """The compiled filter: ``struct sock_filter`` records, ready for ``bwrap --seccomp FD``."""
    a = _by_arch()
    eperm = SECCOMP_RET_ERRNO | (errno_blocked & 0xFFFF)
    for arch, table in TABLES.items():
        p = f"{arch:x}_"
        a.label(f"arch_{arch:x}")
        a.ld(OFF_NR)
        if arch == AUDIT_ARCH_X86_64:
            a.jump(BPF_JGE, X32_SYSCALL_BIT, p + "eperm")
        a.jump(BPF_JEQ, table["clone"], p + "clone")
        a.jump(BPF_JEQ, table["clone3"], p + "enosys")
        a.jump(BPF_JEQ, table["personality"], p + "personality")
        for name in blocked_names():
            if name in table:
                a.jump(BPF_JEQ, table[name], p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "clone")
        a.ld(OFF_ARG0_LO)
        a.jump(BPF_JSET, CLONE_NEW_ANY, p + "eperm", 0)
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "personality")
        a.ld(OFF_ARG0_LO)
        a.jump(BPF_JEQ, PER_LINUX, p + "allow")
        a.jump(BPF_JEQ, PER_QUERY, p + "allow")
        a.label(p + "eperm")
        a.ret(eperm)
        a.label(p + "enosys")
        a.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)
        a.label(p + "allow")
        a.ret(SECCOMP_RET_ALLOW)
    return a.assemble()


# The warm start (autograder/isolation/warm.py): a learner's worker is forked from a template process
# that runs as the same uid in the same PID and IPC namespace. This second filter, loaded by
# each forked worker before any learner code runs (on top of `program`), keeps it from
# reaching the template or leaving anything in the shared namespaces for the next learner.
CHILD_DENIED = ("tkill", "pidfd_send_signal", "shmget", "semget", "msgget", "mq_open")
CHILD_RULES = {
    "kill": "EPERM for the template's pid, process group and session, their negatives, and -1 (every process)",
    "tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open": "EPERM when the target is a protected pid",
    "tkill, pidfd_send_signal": "EPERM (a thread id or a /proc folder can name the template)",
    "fcntl F_SETOWN, F_SETOWN_EX, F_SETSIG; ioctl FIOSETOWN, SIOCSPGRP":
        "EPERM: SIGIO/SIGURG (or any signal F_SETSIG chooses) would reach the owner set there",
    "clone with CLONE_PARENT": "EPERM: a sibling of the worker would be the template's child",
    "shmget, semget, msgget, mq_open": "EPERM: SysV IPC objects and POSIX message queues outlive their "
                                       "processes in the namespace the next learner shares",
    "socket AF_INET, AF_INET6": "EPERM: the network namespace is the template's, shared by the next learner, "
                                "and keeps traces of closed connections (TIME_WAIT ports, counters)",
}


def child_program(protected: tuple[int, ...] | list[int]) -> bytes:
    """The warm-start worker's extra filter; `protected` are the pids (in the sandbox's PID
    namespace) of the template, its process group and session, and the namespace's init."""
    prot = sorted({p & 0xFFFFFFFF for p in protected if p > 0})
    signal_targets = sorted(set(prot) | {(-p) & 0xFFFFFFFF for p in prot} | {0xFFFFFFFF})
    a = _by_arch()
    for arch, t in TABLES.items():
        p = f"{arch:x}_"
        a.label(f"arch_{arch:x}")
        a.ld(OFF_NR)
        a.jump(BPF_JEQ, t["kill"], p + "kill")
        for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open"):
            a.jump(BPF_JEQ, t[name], p + "target")
        a.jump(BPF_JEQ, t["fcntl"], p + "fcntl")
        a.jump(BPF_JEQ, t["ioctl"], p + "ioctl")
        a.jump(BPF_JEQ, t["clone"], p + "clone")
        a.jump(BPF_JEQ, t["socket"], p + "socket")
        for name in CHILD_DENIED:
            a.jump(BPF_JEQ, t[name], p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "kill")
        a.ld(OFF_ARG0_LO)
        for v in signal_targets:
            a.jump(BPF_JEQ, v, p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "target")
        a.ld(OFF_ARG0_LO)
        for v in prot + [0xFFFFFFFF]:
            a.jump(BPF_JEQ, v, p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "fcntl")
        a.ld(OFF_ARG1_LO)
        for v in (F_SETOWN, F_SETSIG, F_SETOWN_EX):
            a.jump(BPF_JEQ, v, p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "ioctl")
        a.ld(OFF_ARG1_LO)
        for v in (FIOSETOWN, SIOCSPGRP):
            a.jump(BPF_JEQ, v, p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "clone")
        a.ld(OFF_ARG0_LO)
        a.jump(BPF_JSET, CLONE_PARENT, p + "eperm", 0)
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "socket")
        a.ld(OFF_ARG0_LO)
        for v in (AF_INET, AF_INET6):
            a.jump(BPF_JEQ, v, p + "eperm")
        a.ret(SECCOMP_RET_ALLOW)
        a.label(p + "eperm")
        a.ret(SECCOMP_RET_ERRNO | errno.EPERM)
    return a.assemble()


def evaluate(prog: bytes, *, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel would return for this call: a classic-BPF interpreter for the
    instructions `program` uses (for tests, on any architecture)."""
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(x & 0xFFFFFFFFFFFFFFFF for x in args))
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == BPF_LD | BPF_W | BPF_ABS:
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code == BPF_RET | BPF_K:
            return k
        elif code & 0x07 == BPF_JMP:
            op = code & 0xF0
            hit = {BPF_JEQ: acc == k, BPF_JGE: acc >= k, BPF_JSET: bool(acc & k)}[op]
            pc += 1 + (jt if hit else jf)
        else:
            raise ValueError(f"unexpected BPF instruction {code:#x}")


def host_arch() -> int | None:
    """This machine's AUDIT_ARCH, or None where the filter has no table for it."""
    return {"x86_64": AUDIT_ARCH_X86_64, "amd64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64,
            "arm64": AUDIT_ARCH_AARCH64}.get(platform.machine().lower())


def describe() -> list[str]:
    """One line per blocked family, for the documentation and `Sandbox.describe`."""
    lines = [f"{', '.join(names)}: {why}" for why, names in BLOCKED]
    lines += [f"{name}: {what}" for name, what in SPECIAL.items()]
    return lines

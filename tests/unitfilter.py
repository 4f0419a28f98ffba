"""Run a command under a unit's SystemCallFilter= and RestrictNamespaces=, as systemd would
install them, without systemd: `python unitfilter.py UNIT_FILE COMMAND...` loads a seccomp
filter (libseccomp, through ctypes) and execs COMMAND. The syscall groups are expanded by
`systemd-analyze syscall-filter`; a call outside them fails with EPERM (the units'
SystemCallErrorNumber=). Namespace flags of unshare, clone and setns are checked as systemd
checks them, and clone3 answers ENOSYS (its flags cannot be read by a filter). Test helper
only: sets no_new_privs (the units' NoNewPrivileges=yes)."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
NAMESPACES = {"mnt": 0x00020000, "cgroup": 0x02000000, "uts": 0x04000000, "ipc": 0x08000000,
              "user": 0x10000000, "pid": 0x20000000, "net": 0x40000000, "time": 0x00000080}


def errno_action(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True, text=True,
                         check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.split()[0], [])
        elif current is not None and line.strip() and not line.strip().startswith("#"):
            current.append(line.split()[0])
    return groups


def expand(words: list[str], groups: dict[str, list[str]]) -> set[str]:
    names: set[str] = set()
    for word in words:
        names |= expand(groups[word], groups) if word.startswith("@") else {word}
    return names


def unit_setting(unit: str, key: str) -> list[str]:
    with open(unit) as f:
        values = [line.split("=", 1)[1].split() for line in f if line.startswith(key + "=")]
    assert len(values) == 1, f"{unit}: one {key}= line expected"
    return values[0]


def load(unit: str) -> None:
    allowed = expand(unit_setting(unit, "SystemCallFilter"), syscall_groups())
    ns_allowed = 0
    for name in unit_setting(unit, "RestrictNamespaces"):
        ns_allowed |= {"yes": 0, "no": sum(NAMESPACES.values())}.get(name) or NAMESPACES.get(name, 0)
    refused_ns = sum(NAMESPACES.values()) & ~ns_allowed
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    ctx = ctypes.c_void_p(lib.seccomp_init(errno_action(errno.EPERM)))
    checked = {"unshare": 0, "clone": 0, "setns": 1}  # the argument that carries the flags (x86, arm)
    for name in sorted(allowed):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0 and name not in checked and name != "clone3":
            continue  # not a call of this architecture
        if name == "clone3":
            lib.seccomp_rule_add_array(ctx, errno_action(errno.ENOSYS), nr, 0, None)
        elif name in checked:
            cmp = ArgCmp(checked[name], SCMP_CMP_MASKED_EQ, refused_ns, 0)
            if lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, ctypes.byref(cmp)) != 0:
                raise OSError(f"seccomp rule for {name} refused")
        else:
            lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None)
    if lib.seccomp_load(ctx) != 0:
        raise OSError("seccomp_load failed")


if __name__ == "__main__":
    load(sys.argv[1])
    os.execvp(sys.argv[2], sys.argv[2:])

"""Who holds a lease, and whether that holder is known to be gone.

A lease token names its holder: host, kernel (its boot id), PID namespace and
process id, then random bytes so no two holders ever share one. A lease's
expiry is the only proof of a holder's death in general; but a holder on this
very kernel, in this PID namespace, whose process no longer exists (or is a
zombie) is gone for sure, and its leases may be taken at once instead of after
their time to live. Anything else (another kernel, another namespace, a token
of another form, a process that exists) counts as alive: a wrong "alive" only
costs a wait, a wrong "gone" would let two writers work on one saga.

The hostname alone does not tell machines apart: cloned machines keep theirs,
and ``localhost`` is common; nor does the PID namespace, since the first one's
inode number is the same on every Linux machine. The boot id does: a fresh
random one per kernel boot, shared by every container and namespace on it.
"""

from __future__ import annotations

import os
import socket

SEP = "/"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        return "-"


def _boot_id() -> str:
    try:
        with open(BOOT_ID) as f:
            return f.read().strip().replace("-", "") or "-"
    except OSError:
        return "-"


def holder_token(kind: str) -> str:
    """A fresh token for a lease held by this process:
    ``kind/host/boot-id/pidns/pid/random``."""
    return SEP.join((kind, socket.gethostname(), _boot_id(), _pid_namespace(),
                     str(os.getpid()), os.urandom(8).hex()))


def holder_gone(token: str) -> bool:
    """True only if the token's holder is a process on this host, kernel and PID
    namespace that has ended (a token of the form before the boot id counts as
    alive: its lease lapses on its own)."""
    parts = token.split(SEP)
    if len(parts) != 6 or not parts[4].isdigit():
        return False
    _, host, boot, pidns, pid_text, _ = parts
    if host != socket.gethostname() or "-" in (boot, pidns) or boot != _boot_id() \
            or pidns != _pid_namespace():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False
    return state in (b"Z", b"X")  # exited, not yet reaped by its parent

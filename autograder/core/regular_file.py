"""The one reader of a file that someone else may control (a learner's notebook).

Whoever reads a notebook (the submissions folder's claims, `notebook.read_notebook`) reads
it here, and so the same way: every component below a trusted folder is opened without
following a symbolic link (O_NOFOLLOW: a link fails with ELOOP, a folder swapped for a file
with ENOTDIR), the file itself without blocking (O_NONBLOCK: a FIFO would otherwise wait for
a writer), `fstat` must say it is a regular file (not a FIFO, socket, device or folder), and
at most the cap plus one byte is read, so the caller sees that a file was over the cap and
neither /dev/zero nor a file that grows while it is read can fill the memory.

The reader only says why it refused (`Bytes.refused`); each caller words that for its reader.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

LINK, ERROR = "link", "error"  # refusals besides the kinds of `kind_of`
CHUNK = 1 << 20
BASE_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


def kind_of(mode: int) -> str:
    """What an `lstat` or `fstat` mode is: "file", "dir", "link", "fifo", "socket", "device" or "other"."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def read_at_most(fd: int, limit: int) -> bytes:
    """The bytes of `fd` up to `limit` + 1 (so that a caller sees it was over the limit), no more."""
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, min(CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


@dataclass
class Bytes:
    """What `read_regular` read, or why it read nothing."""

    data: bytes | None = None  # at most limit + 1 bytes (more than `limit`: over the cap); None if refused
    refused: str = ""          # LINK, ERROR, or the kind (`kind_of`) of what is not a regular file
    strerror: str = ""         # with ERROR: the system's words
    size: int = 0              # st_size when it was opened
    mtime: float | None = None
    mtime_ns: int = 0

    def over(self, limit: int) -> bool:
        return self.data is not None and len(self.data) > limit


def read_regular(base: str | Path, parts: tuple, limit: int) -> Bytes:
    """At most `limit` + 1 bytes of the regular file BASE/PARTS[0]/.../PARTS[-1].

    BASE, a folder, is trusted (opened as given, links followed); every one of PARTS is opened
    below it without following a link (a link there, or a folder replaced by something else,
    is refused as LINK), the last one without blocking. An error opening any of them is ERROR
    with the system's words; what is not a regular file is refused with its kind."""
    fds = []
    try:
        try:
            # O_PATH: a folder that may only be searched (mode 0711) serves as well as a readable one
            fd = os.open(str(base) or ".", BASE_FLAGS)
        except OSError as exc:
            return Bytes(refused=ERROR, strerror=exc.strerror or str(exc))
        fds.append(fd)
        try:
            for part in parts[:-1]:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                fds.append(fd)
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            fds.append(fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return Bytes(refused=LINK)
            return Bytes(refused=ERROR, strerror=exc.strerror or str(exc))
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Bytes(refused=kind_of(st.st_mode), size=st.st_size)
        return Bytes(read_at_most(fd, limit), size=st.st_size, mtime=st.st_mtime, mtime_ns=st.st_mtime_ns)
    finally:
        for f in fds:
            os.close(f)


def read_file(path: str | Path, limit: int) -> Bytes:
    """`read_regular` of one path: its folder is trusted, the file itself is not followed if a link."""
    path = Path(path)
    return read_regular(path.parent, (path.name,), limit)


__all__ = ["LINK", "ERROR", "Bytes", "kind_of", "read_at_most", "read_regular", "read_file"]

"""The grader's runtime folder: state shared by the grading processes of one user on one machine.

It holds the uid slots' lock files (`autograder.isolation.uids`), so it must be a place no other local user
can create or replace first: /run/autograder for root, else the user's $XDG_RUNTIME_DIR or a
folder in the home from the password database (`runtime_candidates`), each accepted only when
every folder on its way is private (`runtime_dir`).
"""

from __future__ import annotations

import os
import stat

from .unavailable import SandboxUnavailable


def _private_chain(folder: str) -> bool:
    """Whether no other user can rename, replace or add entries on the way to FOLDER.

    Every folder from / down to FOLDER must be a real folder (not a link) owned by root or by
    us, and writable by nobody else, except a sticky folder (such as /tmp) whose next entry
    on the way is owned by root or by us: there, others may add names but cannot move or
    remove ours."""
    me = os.geteuid()
    parts = os.path.abspath(folder).split(os.sep)[1:]
    path, above = os.sep, None
    for name in ["", *parts]:
        path = os.path.join(path, name) if name else path
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me):
            return False
        if above is not None and above.st_mode & 0o022 and not above.st_mode & stat.S_ISVTX:
            return False  # the folder above lets others rename this one
        above = st
    return not above.st_mode & 0o022


def runtime_candidates() -> list[str]:
    """Where the grader keeps its runtime state, best first: a folder only root can create in
    (/run) when run as root, else the user's own runtime folder ($XDG_RUNTIME_DIR); then the
    user's home, from the password database (not $HOME, which `sudo` may keep)."""
    import pwd

    me = os.geteuid()
    out = []
    if me == 0:
        out.append("/run/autograder")
    else:
        xdg = os.environ.get("XDG_RUNTIME_DIR", "")
        if os.path.isabs(xdg):
            out.append(os.path.join(xdg, "autograder"))
    try:
        home = pwd.getpwuid(me).pw_dir
    except KeyError:
        home = ""
    if os.path.isabs(home):
        out.append(os.path.join(home, ".cache", f"autograder-runtime-{me}"))
    return out


def runtime_dir(candidates: list[str] | None = None) -> str:
    """The grader's runtime folder for this user: the first candidate (`runtime_candidates`) that
    no other user could have created or planted, made here with mode 0700 if missing.

    A candidate is skipped when a folder on its way is not private (`_private_chain`), or when
    something other than our own 0700 folder already has its name; a grading process never
    chooses a place that a local user could take first (a world-writable /tmp was one: any user
    could create the folder there before the first `grade`, and every grading run by root then
    refused to start)."""
    tried = []
    for folder in candidates if candidates is not None else runtime_candidates():
        parent = os.path.dirname(os.path.abspath(folder))
        existing = parent
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not _private_chain(existing):
            tried.append(f"{folder} (a folder above it is not private to uid {os.geteuid()} or root)")
            continue
        try:
            os.makedirs(parent, mode=0o700, exist_ok=True)
            if not _private_chain(parent):
                tried.append(f"{folder} (a folder above it is not private to uid {os.geteuid()} or root)")
                continue
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            tried.append(f"{folder} ({exc.strerror})")
            continue
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            tried.append(f"{folder} (not a folder of uid {os.geteuid()} with mode 0700)")
            continue
        return folder
    raise SandboxUnavailable("no private folder for the grader's runtime state: " + "; ".join(tried or ["none"]))

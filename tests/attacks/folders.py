"""Attacks through the submissions folder: hidden and nested copies that claim other learners,
links, FIFOs and other special files, names that are not student ids, two notebooks for one id.

`build(ctx)` creates them under `ctx.subs` beside round one's flat `NAME.ipynb` files (see
tests/attacks/__init__.py); tests/end_to_end/test_adversarial_folders.py asserts each outcome: graded as
itself, or not graded with a reason, never attributed to another learner, nothing written
outside the output folder.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import nbformat

from conftest import learner_notebook, mistake, reference_notebook

KEY = "03_qkv"
WRONG_AXIS = ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)")
DEEP = 60  # folders below deep/


def _ref() -> str:
    return nbformat.writes(reference_notebook(KEY))


def _stub() -> str:
    return nbformat.writes(learner_notebook(KEY))


def _wrong() -> str:
    return nbformat.writes(mistake(KEY, WRONG_AXIS)())


def _put(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# What each attack must come to (the tests read these).
GRADED_AS_ITSELF = {            # student -> what its own notebook is
    "victim_low": "wrong", "victim_low_control": "wrong", "victim_full": "reference",
    "mallory": "stub", "trudy": "stub", "space_name": "reference",
}
NOT_GRADED = {                  # student -> words its reason must hold
    "symlink_zero": "symbolic link", "symlink_other": "symbolic link", "symlink_outside": "symbolic link",
    "symlink_in_folder": "symbolic link", "fifo_notebook": "FIFO", "fifo_in_folder": "FIFO",
    "socket_notebook": "socket", "twice": "2 notebooks claim", "dup": "2 notebooks claim",
    "Casey": "differs from it only in case", "casey": "differs from it only in case", "deep": "no notebook",
}
REJECTED = {                    # entry (relative to subs) -> words its reason must hold
    "..ipynb": "hidden", "...ipynb": "hidden", "space name.ipynb": "not a student id",
    "-rf.ipynb": "not a student id", "=cmd().ipynb": "not a student id", "tab\tname.ipynb": "not a student id",
    f"{KEY}.ipynb": "exercise's name", KEY: "exercise's name", "linked_dir": "symbolic link",
    "loop": "symbolic link", ".hidden_top": "hidden",
    "mallory/03_qkv/.hidden": "hidden", "mallory/.cache": "hidden", "mallory/victim_low.ipynb": "layout",
    "mallory/03_qkv/victim_full": "below the layout", "trudy/03_qkv/.git": "hidden",
    "deep/a": "below the layout",
}
FLAGGED = {"mallory": ".hidden", "trudy": ".git", "deep": "below the layout"}


def build(ctx) -> None:
    subs, base = ctx.subs, ctx.base
    ref, stub, wrong = _ref(), _stub(), _wrong()
    made = []  # entries that are not regular files (the tests check nothing else appeared)

    # victims and their control: a wrong notebook (16-ish / max) and a correct one
    _put(subs / "victim_low.ipynb", wrong)
    _put(subs / "victim_low_control.ipynb", wrong)
    _put(subs / "victim_full.ipynb", ref)

    # 1. mallory hands in her own (empty) notebook, plus copies that claim the victims in hidden,
    #    misplaced and nested folders of her own folder (nbgrader's exchange copies hidden folders)
    _put(subs / "mallory.ipynb", stub)
    _put(subs / "mallory" / KEY / ".hidden" / "victim_low" / KEY / f"{KEY}.ipynb", ref)
    _put(subs / "mallory" / KEY / ".hidden" / "victim_full" / KEY / f"{KEY}.ipynb", stub)
    _put(subs / "mallory" / ".cache" / "victim_full.ipynb", stub)
    _put(subs / "mallory" / "victim_low.ipynb", ref)
    _put(subs / "mallory" / KEY / "victim_full" / KEY / f"{KEY}.ipynb", stub)
    # 2. the same in nbgrader's layout, claiming round one's zz_other
    _put(subs / "trudy" / KEY / f"{KEY}.ipynb", stub)
    _put(subs / "trudy" / KEY / "timestamp.txt", "2024-01-01 00:00:00.000000 UTC")  # nbgrader's: ignored
    _put(subs / "trudy" / KEY / ".git" / "zz_other" / KEY / f"{KEY}.ipynb", stub)

    # 3. links: to a device, to another learner's notebook, out of the folder, as a folder, a loop
    outside = base / "outside"
    _put(outside / "secret.ipynb", ref)
    _put(outside / "dir" / KEY / f"{KEY}.ipynb", ref)
    links = {"symlink_zero.ipynb": "/dev/zero", "symlink_other.ipynb": "zz_other.ipynb",
             "symlink_outside.ipynb": str(outside / "secret.ipynb"), "linked_dir": str(outside / "dir"),
             "loop": "loop"}
    for name, target in links.items():
        os.symlink(target, subs / name)
        made.append(name)
    (subs / "symlink_in_folder" / KEY).mkdir(parents=True)
    os.symlink("../../victim_full.ipynb", subs / "symlink_in_folder" / KEY / f"{KEY}.ipynb")
    made.append(f"symlink_in_folder/{KEY}/{KEY}.ipynb")

    # 4. special files named like notebooks: they must be refused without being opened (a FIFO
    #    would block a reader forever), as a flat file and at nbgrader's place
    os.mkfifo(subs / "fifo_notebook.ipynb")
    (subs / "fifo_in_folder" / KEY).mkdir(parents=True)
    os.mkfifo(subs / "fifo_in_folder" / KEY / f"{KEY}.ipynb")
    made += ["fifo_notebook.ipynb", f"fifo_in_folder/{KEY}/{KEY}.ipynb"]
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(subs / "socket_notebook.ipynb"))
        made.append("socket_notebook.ipynb")
    except OSError:  # a path too long for a socket: the attack is skipped
        NOT_GRADED.pop("socket_notebook", None)
    finally:
        sock.close()
    try:  # a character device (root only): /dev/zero's numbers
        os.mknod(subs / "device_notebook.ipynb", stat.S_IFCHR | 0o600, os.makedev(1, 5))
        made.append("device_notebook.ipynb")
        NOT_GRADED["device_notebook"] = "device"
    except (OSError, PermissionError):
        pass

    # 5. names that are not student ids (each would have been "sanitised" into one before)
    for name in ("..ipynb", "...ipynb", "space name.ipynb", "-rf.ipynb", "=cmd().ipynb", "tab\tname.ipynb",
                 f"{KEY}.ipynb"):
        _put(subs / name, ref)
    _put(subs / "space_name.ipynb", ref)  # what "space name" was sanitised into: must stay its own
    _put(subs / KEY / f"{KEY}.ipynb", ref)  # a folder named like the exercise
    _put(subs / ".hidden_top" / "victim_low.ipynb", ref)
    _put(subs / ".ipynb_checkpoints" / "victim_low-checkpoint.ipynb", ref)  # Jupyter's: silently skipped

    # 6. two notebooks for one student: in one folder, flat and in a folder, ids differing in case
    _put(subs / "twice" / f"{KEY}.ipynb", ref)
    _put(subs / "twice" / KEY / f"{KEY}.ipynb", ref)
    _put(subs / "dup.ipynb", ref)
    _put(subs / "dup" / KEY / f"{KEY}.ipynb", stub)
    _put(subs / "Casey.ipynb", ref)
    _put(subs / "casey.ipynb", stub)

    # 7. deep nesting: a notebook 60 folders down, in a folder of its own
    _put(subs.joinpath("deep", *(["a"] * DEEP), f"{KEY}.ipynb"), ref)

    ctx.extra["folders"] = {"outside": outside, "special": made}
    ctx.protected += [outside / "secret.ipynb", outside / "dir" / KEY / f"{KEY}.ipynb"]

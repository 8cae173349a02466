"""The one reader of a learner's file (`autograder.core.regular_file`), as the notebook reader uses it:
never through a link, never blocked by a FIFO, never a device, never past the cap. Fast."""

from __future__ import annotations

import os
import threading

import pytest

from autograder.core.notebook import NotebookError, read_bytes
from autograder.core.regular_file import ERROR, LINK, read_file, read_regular


def _in_time(fn):
    """fn() in a thread that must end within 10 s (a FIFO opened for reading would block)."""
    box = {}

    def call():
        try:
            box["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the reader blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_what_the_reader_refuses(tmp_path):
    (tmp_path / "nb.ipynb").write_text("{}")
    os.symlink(tmp_path / "nb.ipynb", tmp_path / "link.ipynb")
    os.symlink(tmp_path, tmp_path / "linkdir")
    os.mkfifo(tmp_path / "fifo.ipynb")
    assert read_file(tmp_path / "nb.ipynb", 100).data == b"{}"
    assert read_file(tmp_path / "link.ipynb", 100).refused == LINK
    assert read_regular(tmp_path, ("linkdir", "nb.ipynb"), 100).refused == LINK
    assert read_regular(tmp_path, ("nb.ipynb", "x"), 100).refused == LINK  # a file where a folder was
    assert _in_time(lambda: read_file(tmp_path / "fifo.ipynb", 100)).refused == "fifo"
    assert read_file("/dev/zero", 100).refused == "device"
    assert read_file(tmp_path, 100).refused == "dir"
    missing = read_file(tmp_path / "missing.ipynb", 100)
    assert missing.refused == ERROR and missing.strerror == "No such file or directory"
    big = read_file(tmp_path / "nb.ipynb", 1)
    assert big.over(1) and big.data == b"{}" and big.size == 2


@pytest.mark.parametrize("make, words", [
    (lambda d: os.symlink(d / "real.ipynb", d / "nb.ipynb"), "nb.ipynb is a symbolic link (never followed)"),
    (lambda d: os.mkfifo(d / "nb.ipynb"), "nb.ipynb is not a regular file"),
    (lambda d: os.symlink("/dev/zero", d / "nb.ipynb"), "nb.ipynb is a symbolic link (never followed)"),
    (lambda d: (d / "nb.ipynb").mkdir(), "nb.ipynb is not a regular file"),
    (lambda d: None, "cannot read nb.ipynb: No such file or directory"),
    (lambda d: (d / "nb.ipynb").write_text("x" * 3 * 2**20), "nb.ipynb is 3.0 MiB; notebooks over 2 MiB are not graded"),
])
def test_the_notebook_reader_says_why(tmp_path, make, words):
    (tmp_path / "real.ipynb").write_text("{}")
    make(tmp_path)
    with pytest.raises(NotebookError) as info:
        _in_time(lambda: read_bytes(tmp_path / "nb.ipynb", 2 * 2**20))
    assert str(info.value).startswith(words)

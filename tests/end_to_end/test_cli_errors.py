"""Usage errors of every subcommand: an unknown exercise key, a flag that is wrong or goes with
another, a file that is not there. Each is one sentence on stderr, nothing on stdout, no
traceback, and exit code 2, whichever command found it (`usage.UsageError`, turned into that
line once, in `cli.run`; argparse's own errors exit 2 as well). Fast: nothing is graded."""

from __future__ import annotations

import pytest

from autograder.cli import main
from conftest import run_cli

UNKNOWN = "unknown assignment '99_nope' (known: 01_seq2seq"


def _usage_error(capsys, argv: list[str]) -> str:
    """The one line `main(argv)` writes on stderr, after checking its exit code and silence elsewhere."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, err)
    assert out == "" and "Traceback" not in err, (argv, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 or lines[0].startswith("usage:"), (argv, err)
    return lines[-1]


@pytest.mark.parametrize("argv", [
    ["generate", "99_nope"],
    ["generate", "03_qkv", "99_nope", "--check"],
    ["mutants", "99_nope"],
    ["mutants", "99_nope", "--list"],
    ["seeds", "99_nope"],
    ["seeds", "03_qkv", "99_nope", "--table-only"],
    ["check", "NOTEBOOK", "--assignment", "99_nope"],
    ["grade", "FOLDER", "--assignment", "99_nope", "--out", "OUT"],
    ["export", "--assignment", "99_nope", "--out", "OUT"],
    ["release", "99_nope", "--out", "OUT"],
    ["similarity", "FOLDER", "--assignment", "99_nope", "--out", "OUT"],
])
def test_an_unknown_exercise_key(argv, capsys, tmp_path):
    """Does every subcommand say which keys exist, with exit 2, for a key that does not?"""
    notebook = tmp_path / "mine.ipynb"
    notebook.write_text("{}")
    argv = [{"NOTEBOOK": str(notebook), "FOLDER": str(tmp_path), "OUT": str(tmp_path / "out")}.get(a, a)
            for a in argv]
    assert _usage_error(capsys, argv).startswith(f"error: {UNKNOWN}")
    assert not (tmp_path / "out").exists()  # nothing was written


def test_a_missing_file_or_folder(capsys, tmp_path):
    """Do `check`, `grade`, `similarity` and `export` name the path that is not there or holds nothing to act on, with exit 2?"""
    line = _usage_error(capsys, ["check", str(tmp_path / "missing.ipynb")])
    assert line.startswith("error: no such file: ") and "missing.ipynb" in line
    line = _usage_error(capsys, ["check", str(tmp_path)])
    assert line.startswith("error: ") and "is a folder" in line
    (tmp_path / "mine.ipynb").write_text("{}")
    line = _usage_error(capsys, ["check", str(tmp_path / "mine.ipynb")])
    assert line.startswith("error: cannot tell which exercise mine.ipynb is")
    (tmp_path / "mine.ipynb").unlink()
    line = _usage_error(capsys, ["grade", str(tmp_path / "nowhere"), "--assignment", "03_qkv",
                                 "--out", str(tmp_path / "out")])
    assert line.startswith("error: no such file or folder: ") and "nowhere" in line
    line = _usage_error(capsys, ["grade", str(tmp_path), "--assignment", "03_qkv", "--out", str(tmp_path / "out")])
    assert line.startswith("error: no notebooks to grade found in ")
    line = _usage_error(capsys, ["similarity", str(tmp_path), "--assignment", "03_qkv", "--out", str(tmp_path / "out")])
    assert line.startswith("error: no notebooks to compare found in ")
    line = _usage_error(capsys, ["export", "--assignment", "03_qkv", "--out", str(tmp_path / "out")])
    assert line.startswith("error: ") and "has no gradebook.db" in line
    assert not (tmp_path / "out").exists()  # nothing was written


@pytest.mark.parametrize("argv, words", [
    (["grade", ".", "--assignment", "03_qkv", "--insecure-scheduler"], "--insecure-scheduler goes with --scheduler"),
    (["seeds", "03_qkv", "05_multi_head", "--rows", "ref"], "--rows and --mutant name the rows or mutants of one"),
    (["grade", "--assignment", "03_qkv"], "the following arguments are required: submissions"),
    (["grade", ".", "--assignment", "03_qkv", "--jobs", "0"], "must be 1 or more"),
    (["mutants", "03_qkv", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["check"], "the following arguments are required: notebook"),
    (["nosuchcommand"], "invalid choice"),
])
def test_a_bad_flag(argv, words, capsys):
    """Is a flag that is unknown, malformed or without its partner a usage error (exit 2)?"""
    assert words in _usage_error(capsys, argv)


def test_the_command_line_itself(tmp_path):
    """As a user runs it (`python -m autograder`, whose `check` ends the process early): exit 2, one line."""
    for args in (["generate", "99_nope"], ["check", str(tmp_path / "missing.ipynb")]):
        proc = run_cli(*args, timeout=300)
        assert proc.returncode == 2 and proc.stdout == "", (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr


def test_an_unknown_assignment_named_by_a_notebook_is_shown_cut(tmp_path):
    """Is an exercise key taken from a learner's notebook (its course metadata, here a megabyte long) shown
    escaped and cut in the one-line error, not echoed whole?"""
    from autograder.core.usage import UsageError, known_assignment

    with pytest.raises(UsageError) as info:
        known_assignment("x\x1b[2J" * 200_000)
    message = str(info.value)
    assert message.startswith("unknown assignment 'x\\x1b[2J") and len(message) < 400 and "\x1b" not in message
    assert "more characters)" in message and "(known: 01_seq2seq" in message

"""What the kept weights of chapters 08 and 09 share: the hash of the code that trained them.

Each experiment lists the code its weights depend on (`trained_code()`: functions, classes,
modules and strings such as a regular expression's pattern); the hash of that code is written
into the weights' manifest, and the book loads the weights only while it still matches.

The hash covers what runs, not what is read: comments and docstrings are removed from the
source before hashing (and blank lines and trailing spaces dropped), so rewording a docstring
or a shape comment does not make the weights stale and does not retrain the models, while any
change to the code itself does. The removal relies only on `ast` positions and `tokenize`
comments, never on `ast.unparse` or `ast.dump`, whose output differs between Python versions:
the same code gives the same hash on Python 3.10 to 3.13.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import textwrap
import tokenize

DOCSTRING_HOLDERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_spans(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """(lineno, col_offset, end_lineno, end_col_offset) of every docstring in `tree`: the first
    statement of a module, class or function body when it is a str constant. Columns are
    byte offsets into the UTF-8 line, as `ast` gives them."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, DOCSTRING_HOLDERS) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                spans.append((first.lineno, first.col_offset, first.end_lineno, first.end_col_offset))
    return spans


def comment_spans(source: str) -> list[tuple[int, int, int, int]]:
    """(row, col, end_row, end_col) of every comment in `source`, columns in characters."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(*tok.start, *tok.end) for tok in tokens if tok.type == tokenize.COMMENT]


def char_col(line: str, byte_col: int) -> int:
    """The character offset in `line` of its UTF-8 byte offset `byte_col`."""
    return len(line.encode()[:byte_col].decode())


def strip_comments_and_docstrings(source: str) -> str:
    """`source` without its comments and docstrings, blank lines and trailing spaces."""
    source = textwrap.dedent(source)
    lines = source.split("\n")
    spans = [(r, char_col(lines[r - 1], c), er, char_col(lines[er - 1], ec))
             for r, c, er, ec in docstring_spans(ast.parse(source))]
    spans += comment_spans(source)
    for row, col, end_row, end_col in sorted(spans, reverse=True):
        lines[row - 1:end_row] = [lines[row - 1][:col] + lines[end_row - 1][end_col:]]
    kept = (line.rstrip() for line in lines)
    return "\n".join(line for line in kept if line) + "\n"


def code_text(obj) -> str:
    """What is hashed for one entry: a str as it is, any other object its source as it runs."""
    return obj if isinstance(obj, str) else strip_comments_and_docstrings(inspect.getsource(obj))


def source_hash(objects) -> str:
    """16 hex digits of the SHA-256 of the objects' code (`code_text`), in order."""
    h = hashlib.sha256()
    for obj in objects:
        h.update(code_text(obj).encode())
    return h.hexdigest()[:16]

"""What the kept weights of chapters 08 and 09 share: the hash of the code that trained them.

Each experiment lists the code its weights depend on (`trained_code()`: functions, classes,
modules and strings such as a regular expression's pattern); the hash of their source is
written into the weights' manifest, and the book loads the weights only while it still matches.
"""

from __future__ import annotations

import hashlib
import inspect


def source_hash(objects) -> str:
    """16 hex digits of the SHA-256 of the objects' source, in order (a str is taken as it is)."""
    h = hashlib.sha256()
    for obj in objects:
        h.update((obj if isinstance(obj, str) else inspect.getsource(obj)).encode())
    return h.hexdigest()[:16]

"""Why isolation cannot be had here: the errors the sandbox and the warm start raise.

`SandboxUnavailable` comes from every part of the sandbox's set-up (bubblewrap and util-linux,
the uids, the runtime folder that holds the uid slots) and `TemplateUnavailable` from the warm
start; the runner, the grader and the commands catch them. They live in this module, which
imports nothing, so that each of those modules can name them without importing another.
"""

from __future__ import annotations


class SandboxUnavailable(RuntimeError):
    """Bubblewrap is missing or does not work here; the message says what to do."""


class TemplateUnavailable(RuntimeError):
    """No template could serve this submission; it is graded by a fresh worker instead."""

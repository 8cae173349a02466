"""What a call into a learner's code can raise on the trusted side, each turned into a hint by
the grader: the learner's own exception, a stub, a missing name, a time-out, a worker that died,
an argument changed in place, or a reply that breaks the protocol."""

from __future__ import annotations


class GradingError(Exception):
    """A failure on the learner's side of a call; the grader turns it into a hint."""

    def __init__(self, name: str, message: str = ""):
        super().__init__(message or name)
        self.name = name
        self.during_load = False


class LearnerError(GradingError):
    """The learner's function raised an exception."""

    def __init__(self, name: str, etype: str, message: str):
        super().__init__(name, f"{etype}: {message}")
        self.etype, self.message = etype, message


class NotImplementedRemote(GradingError):
    """The learner's function is still the stub."""


class MissingName(GradingError):
    """The notebook does not define the name."""


class CallTimeout(GradingError):
    """The call did not finish in time; the worker was killed."""

    def __init__(self, name: str, seconds: float):
        super().__init__(name, f"timed out after {seconds:.0f} s")
        self.seconds = seconds


class WorkerDied(GradingError):
    """The learner's code ended the worker process (exit, os._exit, a crash)."""


class ArgumentChanged(GradingError):
    """The learner's function changed one of the arguments it was given, in place."""

    def __init__(self, name: str, argument: str):
        super().__init__(name, f"changed its argument {argument}")
        self.argument = argument


class BoundaryError(GradingError):
    """The worker sent something that breaks the protocol, or too much of it."""

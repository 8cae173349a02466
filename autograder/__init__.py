"""The course's grader: generates learner notebooks from masters and grades submissions.

Learner code never runs in the process that decides a score: see `autograder.runner`
(the trusted side) and `autograder.worker` (the child process that runs learner code).
"""

from .assignments import Assignment, all_assignments, get_assignment

__all__ = ["Assignment", "all_assignments", "get_assignment"]

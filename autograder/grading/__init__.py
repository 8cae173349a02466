"""Grading one notebook: the hidden checks run against a learner's code, points and feedback.

* `grader`: `Grader` loads an exercise's hidden checks (`autograder/hidden/`), runs them
  against the learner's worker and the reference, and gives a `Result`;
* `ahead`: the checks' own work (e.g. searching the reference), done in a thread while the
  worker starts and runs;
* `feedback`: a result as text and HTML, bounded.

It may import: core, isolation, authoring, hidden.
"""

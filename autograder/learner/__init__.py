"""A learner's check: `check()` in a notebook cell, or `python -m autograder check` in a terminal.

* `in_notebook`: the cell's check, which saves nothing and grades the notebook's code in a
  process of its own, with the same checks, points and hints as the grader.

It may import: core, isolation, grading.
"""

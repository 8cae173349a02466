"""The hidden checks, one file per exercise (``test_KEY.py``), and what they share (`support`).

Each check calls the learner's code through `autograder.isolation` (the worker holds it) and
compares it with the reference module in ``solutions/``; see README.md here.

It may import: core, isolation.
"""

"""Reference implementations, one module per chapter (``chKEY.py``).

Every ``chKEY.py`` is generated from the exercise master ``exercises/source/KEY.md``;
edit the master, then run ``python -m autograder generate``.
"""

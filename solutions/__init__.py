"""Reference implementations, one module per chapter (``chKEY.py``).

Every ``chKEY.py`` is generated from the exercise master ``exercises/source/KEY.md``;
edit the master, then run ``python -m autograder generate``. The hidden tests grade a
learner's answers against these modules, and the wheel that learners install carries them.

Nothing else lives here: the book's experiments, data, kept weights, figures and claims are in
``coursebook/``, which imports this package; this package never imports ``coursebook``.
"""

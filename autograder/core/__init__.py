"""The shared core: what every part of the grader reads and writes.

* `assignments`: the course's exercises (keys, masters, notebooks, hidden tests) and where
  they are, in a clone or an installed wheel;
* `limits`: every size and time limit in one place;
* `notebook`: reading a notebook that may be hostile, cell by cell, within the limits;
* `regular_file`: opening a learner's file without following a link or blocking on a pipe;
* `text`: making what a learner controls safe to print, log and write (`safe`, `visible`);
* `logs`: the grader's log, through that filter;
* `learner_errors`: what a missing torch or NumPy means, said to a learner;
* `usage`: the command line's usage errors (`UsageError`, `known_assignment`).

It may import: nothing of the package.
"""

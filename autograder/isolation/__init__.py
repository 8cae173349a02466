"""Running learner code apart from the grader: the worker, its sandbox and its limits.

The trusted side: `runner` (a learner's `Submission`, the worker it talks to), `remote`
(`Learner`, the proxy the hidden checks call the learner's code through), `errors` (what a
call into learner code can raise), `protocol` (the messages between the two sides),
`sandbox` (bubblewrap), `seccomp`, `cgroups` (memory), `uids` (one uid per worker),
`runtime`, `processes`, `memory_meters`, and the warm start (`warm`: workers forked from one
template).

The sandboxed side, started as a script and importing its neighbours as top-level modules
(never the `autograder` package): `worker`, `protocol`, `device_check`, `optimizers`, and for
the warm start's template `warm_server` and `seccomp`. `worker_files` lists them;
tests/test_structure.py checks that it lists every file they import.

It may import: core.
"""

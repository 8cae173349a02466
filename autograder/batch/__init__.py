"""Grading a cohort: many notebooks, on several processes or a cluster.

* `grading_run`: `python -m autograder grade`, from the folder to the gradebook, feedback and
  summary;
* `cohort`: the submissions graded in parallel worker processes;
* `dask_cluster`: the same on a Dask cluster, with TLS and no HTTP.

It may import: core, isolation, grading, course.
"""

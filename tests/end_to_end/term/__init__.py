"""The parts of tests/end_to_end/test_term.py: a term of the course on real parts.

* `machine`: the local users, nbgrader's exchange, and one JupyterHub (configurable-http-proxy,
  LocalProcessSpawner, a shared password) started once for the whole scenario;
* `jupyterhub_config.py`: that hub's configuration (it reads the settings `machine` writes);
* `lab`: what a person does in Chromium: logs in at the hub, uses nbgrader's Assignments panel in
  JupyterLab, edits and runs a notebook, grades by hand in formgrader, reads a page.
"""

"""Writing an exercise: its master, what is generated from it, and a new chapter's scaffold.

* `generate`: the learner notebook and the reference module, made from the master
  (`python -m autograder generate`, `--check` for drift);
* `spec_table`: the table that ties each sentence of an exercise's instructions to the hidden
  checks that test it;
* `scaffold`: the files of a new chapter (`python -m autograder new KEY`).

It may import: core.
"""

"""How much the hidden tests catch: mutants of the reference, and the checks over many seeds.

* `mutants`, `mutation_operators`: the reference changed one operator at a time, each mutant
  graded (`python -m autograder mutants KEY`);
* `seeds`: every check run over many seeds, the reference and typical mistakes, to find a
  check that sits on a boundary (`python -m autograder seeds KEY`).

It may import: core, isolation, authoring, hidden, grading, batch.
"""

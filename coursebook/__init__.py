"""What the book's pages run beside the reference implementations.

The chapters in ``book/`` import from here:

* the experiments and their data: ``seq2seq_experiment`` (chapters 01 and 02), ``g2p_data`` and
  ``g2p_experiment`` (chapter 08), ``gpt_data`` and ``gpt_experiment`` (chapter 09), with the
  kept weights they load (``g2p_weights/``, ``gpt_weights/``) and ``kept_weights``, the hash that
  ties those weights to the code that trained them;
* the measurements that the pages of chapters 08 and 09 report (``g2p_analysis``, ``gpt_analysis``);
* the figures (``figures_*``), drawn with the primitives of ``drawing``, and the explorable
  attention maps (``attention_explorer``);
* ``claims``, which checks what the prose says about a trained or measured result.

This package may import ``solutions`` (the reference implementations, which the hidden tests
grade against); ``solutions`` never imports it. It is not part of the wheel that learners
install: no learner's check and no hidden test needs it.
"""

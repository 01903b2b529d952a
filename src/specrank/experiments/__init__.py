"""The experiments: each one question answered end to end, in one folder holding its run, its tables and figures,
its MLflow logging and its command.

- ``study``: does a learned reranker recover exact root selection's gain? (record to a round target, featurize,
  cross-fit, evaluate, pick a champion, decode unseen prompts online); ``specrank study`` and ``specrank demo``;
- ``online``: selection strategies decoding in the loop, realized against expected acceptance, and their speed;
  ``specrank online``;
- ``tree_config``: which engine tree setting accepts most, and how fast it runs; ``specrank tree-config``;
- ``verify_sweep``: lossy verification rules, block efficiency against exact distortion; ``specrank verify-sweep``.

They sit above the stages (``specrank.workflow``: record, featurize, cross-fit, evaluate) and the stages'
commands; the stages sit above decode, featurize, rerankers and selection.
"""

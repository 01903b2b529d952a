"""The experiments: each one question answered end to end, in one folder holding its entry function, its settings
and result, its tables and figures, its MLflow logging and its command.

Every experiment has one shape: ``experiment(models, settings, *, out, ...) -> Result``, ``models`` a
``ModelSpec`` (or the ``Models`` already loaded), ``settings`` a frozen dataclass saying what it decodes (its
prompts included) and the result a typed object that writes its own tables (``result.write(folder)``, or the
study's directory itself). Each records through the workflow's one ``record`` stage (``workflow.recording``).

- ``study``: ``study(models, StudySettings) -> StudyResult``: does a learned reranker recover exact root
  selection's gain? (record to a round target, featurize, cross-fit, evaluate, pick a champion, decode unseen prompts
  online); ``specrank study`` and ``specrank demo``;
- ``online``: ``compare_online(models, OnlineSettings) -> OnlineComparison``: selection strategies decoding in the
  loop, realized against expected acceptance, and their speed; ``specrank online``;
- ``tree_config``: ``tree_config(models, TreeConfigSettings) -> TreeConfigResult``: which engine tree setting
  accepts most, and how fast it runs; ``specrank tree-config``;
- ``verify_sweep``: ``verify_sweep(models, SweepSettings) -> SweepResult``: lossy verification rules, block
  efficiency against exact distortion; ``specrank verify-sweep``.

They sit above the stages (``specrank.workflow``: record, featurize, cross-fit, evaluate) and the stages'
commands; the stages sit above decode, featurize, rerankers and selection. A new experiment is one more folder
written the same way.
"""

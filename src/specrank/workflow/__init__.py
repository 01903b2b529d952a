"""The research workflow as functions that return typed objects, each saved where it says and opened back:

    recording = record(target, drafter, prompts, out="runs/t1", temperature=1.0)
    features = featurize(recording)
    rerankers = cross_fit(features, rerankers=("isotonic", "base", "rows"))
    evaluation = evaluate(recording, rerankers, out="runs/t1/evaluation")

The experiments (``specrank.experiments``: the study, the online comparison, the tree configurator, the
verification sweep) compose them. ``Recording.open(path)``, ``Features.open(path)`` and ``Rerankers.open(path)`` read a stage's output back. A
stage given ``tracking=Tracking(...)`` logs its finished work to MLflow; nothing it does depends on that log.
The commands ``specrank decode``, ``featurize``, ``train`` and ``evaluate`` are these functions behind a command line.
"""

from specrank.workflow.evaluation import evaluate
from specrank.workflow.features import Features, featurize
from specrank.workflow.recording import Lossy, Recording, record
from specrank.workflow.rerankers import Rerankers, cross_fit, make_reranker
from specrank.workflow.tracking import Tracking

__all__ = [
    "Features",
    "Lossy",
    "Recording",
    "Rerankers",
    "Tracking",
    "cross_fit",
    "evaluate",
    "featurize",
    "make_reranker",
    "record",
]

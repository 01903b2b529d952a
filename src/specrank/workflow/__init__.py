"""The research workflow as functions that return typed objects, each saved where it says and opened back:

    recording = record(target, drafter, prompts, out="runs/t1", temperature=1.0)
    features = featurize(recording)
    rerankers = cross_fit(features, rerankers=("isotonic", "base", "rows"))
    evaluation = evaluate(recording, rerankers, out="runs/t1/evaluation")

``study(target, drafter, out=...)`` composes them at scale (``StudyResult``), and ``compare_online`` decodes
with strategies in the loop (``OnlineComparison``). ``Recording.open(path)``, ``Features.open(path)`` and ``Rerankers.open(path)`` read a stage's output back. A
stage given ``tracking=Tracking(...)`` logs its finished work to MLflow; nothing it does depends on that log.
The commands (``specrank decode``, ``featurize``, ``train``, ``evaluate``, ``online``, ``demo``, ``study``) are these
functions behind a command line.
"""

from specrank.workflow.evaluation import evaluate
from specrank.workflow.features import Features, featurize
from specrank.workflow.online import OnlineComparison, compare_online
from specrank.workflow.recording import Recording, record
from specrank.workflow.rerankers import RERANKER_NAMES, Rerankers, cross_fit, make_reranker
from specrank.workflow.study import StudyResult, study
from specrank.workflow.tracking import Tracking

__all__ = [
    "RERANKER_NAMES",
    "Features",
    "OnlineComparison",
    "Recording",
    "Rerankers",
    "StudyResult",
    "Tracking",
    "compare_online",
    "cross_fit",
    "evaluate",
    "featurize",
    "make_reranker",
    "record",
    "study",
]

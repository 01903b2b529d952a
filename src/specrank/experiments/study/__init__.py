"""The study: the workflow at the scale that can answer whether the rerankers help (``run``), its results page and
figures (``tables``), its MLflow parent runs (``tracking``), ``specrank study`` (``command``) and ``specrank demo``
(``demo``).
"""

from specrank.experiments.study.run import StudyResult, StudySettings, study

__all__ = ["StudyResult", "StudySettings", "study"]

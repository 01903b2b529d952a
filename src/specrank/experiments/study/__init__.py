"""The study: the workflow at the scale that can answer whether the rerankers help (``study_run``:
``study(models, StudySettings) -> StudyResult``; its stages ``round_target``, ``champion_stage``, ``online_phase``),
its figures (``study_tables``, ``tasks``) and results page (``results_page``), its MLflow parent runs
(``study_tracking``), ``specrank study`` (``study_command``) and ``specrank demo`` (``demo``).
"""

from specrank.experiments.study.study_run import StudyResult, study
from specrank.experiments.study.study_settings import StudySettings

__all__ = ["StudyResult", "StudySettings", "study"]

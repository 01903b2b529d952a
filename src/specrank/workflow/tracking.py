"""Where a stage of the workflow logs itself in MLflow."""

from __future__ import annotations

from dataclasses import dataclass, replace

STAGES = ("decode", "featurize", "train", "evaluate")  # a pipeline's stages, in the order they run

@dataclass(frozen=True)
class Tracking:
    """An MLflow store (None: ``$MLFLOW_TRACKING_URI``, else MLflow's default), the experiment and the run's name
    (None: the stage's own default). A stage checks the store reachable before its work (``checked``) and logs
    the work once it is done; the work never reads anything back from the store."""

    uri: str | None
    experiment: str
    run_name: str | None = None

    @classmethod
    def stage(cls, uri: str | None, experiment: str, pipeline: str, stage: str) -> Tracking:
        """The tracking of ``stage`` of the pipeline run named ``pipeline``: its run is ``<pipeline>/<n>-<stage>``
        (``demo-t1/3-train``), numbered in the order of ``STAGES``, so no two pipelines share a run name and,
        sorted by name, each pipeline's runs follow it in the order they ran."""
        return cls(uri, experiment, f"{pipeline}/{STAGES.index(stage) + 1}-{stage}")

    @classmethod
    def opt_in(cls, value: str | None, experiment: str, run_name: str | None = None) -> Tracking | None:
        """For stages that log only when asked: None (``value`` None), else the tracking of store ``value``
        (``"default"``: MLflow's default store)."""
        if value is None:
            return None
        from specrank.tracking.uri import DEFAULT  # MLflow loads only when tracked

        return cls(None if value == DEFAULT else value, experiment, run_name)

    def checked(self) -> Tracking:
        """This tracking with its store resolved and checked reachable (a store that refuses fails here)."""
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri  # MLflow loads only when tracked

        return replace(self, uri=check_tracking_uri(resolve_tracking_uri(self.uri)))

"""What the commands log to MLflow, through ``specrank.tracking`` imported only when a command logs: it imports
MLflow, which a machine may lack (a run under ``--no-tracking`` needs none) and which the CLI sets quiet just
before the command runs."""

from __future__ import annotations


def _tracking():
    from specrank import tracking  # mlflow: optional, imported by a command that logs, after the CLI quiets it

    return tracking


def checked_uri(tracking_uri: str | None) -> str:
    """The tracking URI (``--tracking-uri``, else the environment's, else the default), its store checked."""
    tracking = _tracking()
    return tracking.check_tracking_uri(tracking.resolve_tracking_uri(tracking_uri))


def tracking_uri(args) -> str | None:
    """The command's checked tracking URI, or None under ``--no-tracking``; checked before any work, so that a bad
    store leaves no partial output."""
    return None if args.no_tracking else checked_uri(args.tracking_uri)


def resolve_reranker(source: str, tracking_uri: str | None):
    """A saved reranker or an MLflow model URI, loaded (``tracking.resolve_reranker``)."""
    return _tracking().resolve_reranker(source, tracking_uri=tracking_uri)


def log_run(uri: str, experiment: str, run_name: str, *, params: dict, metrics: dict, tables: dict,
            figures: dict | None = None, report: str | None = None, dicts: dict | None = None,
            description: str | None = None) -> None:
    """One MLflow run: parameters, metrics, tables (``tables/NAME``), figures (``figures/NAME.png``), a Markdown
    report and JSON artifacts (``dicts``: file name -> dict)."""
    tracking = _tracking()
    import mlflow  # loaded with specrank.tracking just above

    with tracking.experiment_run(experiment, run_name=run_name, tracking_uri=uri, description=description):
        tracking.log_params(params)
        tracking.log_metrics(metrics)
        tracking.log_tables(tables)
        for name, figure in (figures or {}).items():
            tracking.log_figure(figure, name)
        if report is not None:
            tracking.log_report(report)
        for name, content in (dicts or {}).items():
            mlflow.log_dict(content, name)


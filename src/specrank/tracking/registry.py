"""Rerankers in the MLflow Model Registry: a logged model becomes a version of a registered model, found by
alias (``models:/NAME@champion``) through ``specrank.tracking.resolve_reranker``."""

from __future__ import annotations

import mlflow

from specrank.tracking.models import quiet_pyfunc_logging

DEFAULT_ALIAS = "champion"


def register_reranker(model_uri: str, name: str, alias: str = DEFAULT_ALIAS, *, description: str | None = None,
                      tags: dict | None = None):
    """Register ``model_uri`` (a logged reranker) as a new version of ``name`` in the current store's registry
    and point ``alias`` at it; return the ModelVersion."""
    client = mlflow.MlflowClient()
    with quiet_pyfunc_logging():
        version = mlflow.register_model(model_uri, name, tags={k: str(v) for k, v in (tags or {}).items()})
    client.set_registered_model_alias(name, alias, version.version)
    if not client.get_registered_model(name).description:
        client.update_registered_model(name, description=f"specrank first-factor reranker; `models:/{name}@{alias}` "
                                                         "is the chosen version (see its description and tags).")
    if description:
        client.update_model_version(name, version.version, description=description)
    return client.get_model_version(name, version.version)

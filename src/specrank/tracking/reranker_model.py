"""The MLflow model of a specrank reranker, as code (MLflow's "models from code").

``specrank.tracking.models.log_reranker`` logs this file as the model and the reranker's format-2
files as its artifact, so nothing is cloudpickled. MLflow runs this script when it loads the model
(``mlflow.pyfunc.load_model``); the package never imports it. ``specrank.tracking.resolve_reranker``
does not run it either: it reads the artifact as data.
"""

import mlflow

from specrank.tracking.models import RerankerModel

mlflow.models.set_model(RerankerModel())

"""Features per first-level candidate (docs/design.md, features and labels): draft, subtree, context, retained rows,
token prior."""

from specrank.featurize.block import RoundInputs, round_inputs
from specrank.featurize.edges import edge_frame
from specrank.featurize.features import FeatureArrays, featurize_rounds, features_meta, round_features
from specrank.featurize.prior import TokenPrior
from specrank.featurize.sets import BASE, DRAFT, FEATURE_SETS, ROWS, resolve_features
from specrank.featurize.storage import edges_run, featurize_run, read_features, read_manifest, write_features

__all__ = [
    "BASE",
    "DRAFT",
    "FEATURE_SETS",
    "FeatureArrays",
    "ROWS",
    "RoundInputs",
    "TokenPrior",
    "edge_frame",
    "edges_run",
    "featurize_rounds",
    "featurize_run",
    "features_meta",
    "read_features",
    "read_manifest",
    "resolve_features",
    "round_features",
    "round_inputs",
    "write_features",
]

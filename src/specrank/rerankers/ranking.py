"""The ranking objective of ``GBMReranker``: LightGBM LambdaRank grouped by round, then calibrated.

A tree or a chain keeps a round's best candidates, so what a first-factor estimate must get right is the order of a
round's candidates, above all its top one. LambdaRank learns that order directly: each round is a query, each
first-level candidate a document, its relevance level the label in [0, 1] times ``RELEVANCE_LEVELS`` (the target's
probability of the candidate at T > 0, its argmax indicator greedily). The gain of level i is i, so the NDCG at the
top is the chosen candidate's label over the round's best: the share of exact selection's first-token acceptance the
choice keeps.

A ranking score is no probability, and a tree multiplies its first factor by deeper ones, so the scores are mapped
onto the label's scale by a logistic of an affine map (Platt scaling, fitted by cross-entropy on the training rows,
slope kept positive so the order is unchanged). The map is folded into the trees' leaves: the fitted booster is an
ordinary one whose logistic output is the calibrated estimate, so every inference path (LightGBM, the compiled
round kernel, treelite, the engines' tensor forest) reads it unchanged.
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
from scipy.optimize import minimize

from specrank import schema

RELEVANCE_LEVELS = 30


def round_groups(X) -> np.ndarray:
    """(n,) each feature row's round as a dense code (its prompt and round)."""
    schema.require_columns(X.columns, ["prompt_id", "round"], "features")
    keys = X["prompt_id"].astype(str) + "\x00" + X["round"].astype(str)
    return np.unique(keys.to_numpy(), return_inverse=True)[1].astype(np.int64)


def fit_ranking(m: np.ndarray, y: np.ndarray, groups: np.ndarray, params: dict, rounds: int,
                categorical: list[int]) -> lgb.Booster:
    """LambdaRank on the matrix ``m`` (n, F) with labels ``y`` (n,) in [0, 1] over the rounds ``groups`` (n,) (a
    round's rows need not be adjacent), calibrated (``calibrate``); ``params``: LightGBM's tree settings."""
    order = np.argsort(groups, kind="stable")
    sizes = np.bincount(groups)
    relevance = np.rint(np.clip(y, 0.0, 1.0) * RELEVANCE_LEVELS)
    params = {**params, "objective": "lambdarank", "label_gain": list(range(RELEVANCE_LEVELS + 1)),
              "lambdarank_truncation_level": int(sizes.max())}
    data = lgb.Dataset(m[order], relevance[order], group=sizes[sizes > 0], categorical_feature=categorical,
                       free_raw_data=True)
    booster = lgb.train(params, data, num_boost_round=rounds)
    slope, intercept = platt(booster.predict(m, raw_score=True), y)
    return fold_affine(booster, slope, intercept)


def platt(score: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a > 0, b) minimizing the cross-entropy of sigmoid(a * score + b) against ``y`` in [0, 1]."""
    score, y = np.asarray(score, np.float64), np.clip(np.asarray(y, np.float64), 0.0, 1.0)
    scale = max(float(np.std(score)), 1e-12)  # the fit runs on a standardized score: one step size fits any model
    s = (score - score.mean()) / scale

    def loss(theta):  # theta = (log a', b'): a' > 0 by construction
        a, b = np.exp(theta[0]), theta[1]
        z = a * s + b
        p = 1.0 / (1.0 + np.exp(-z))
        value = float(np.mean(np.logaddexp(0.0, z) - y * z))
        residual = p - y
        return value, np.array([float(np.mean(residual * s)) * a, float(np.mean(residual))])

    prior = float(np.clip(y.mean(), 1e-6, 1 - 1e-6))
    theta = minimize(loss, np.array([0.0, np.log(prior / (1 - prior))]), jac=True, method="L-BFGS-B").x
    a = float(np.exp(theta[0])) / scale
    return a, float(theta[1]) - a * float(score.mean())


def fold_affine(booster: lgb.Booster, slope: float, intercept: float) -> lgb.Booster:
    """``booster`` with every leaf times ``slope`` and ``intercept`` added to the first tree's leaves, so that its raw
    score is slope * raw + intercept."""
    for tree, info in enumerate(booster.dump_model()["tree_info"]):
        for leaf in range(int(info["num_leaves"])):
            value = booster.get_leaf_output(tree, leaf) * slope + (intercept if tree == 0 else 0.0)
            booster.set_leaf_output(tree, leaf, value)
    return booster

"""Features of the pool subtree below each first-level candidate (docs/design.md, features: subtree).

``child_max_q`` / ``child_entropy``: the largest drafter probability among the candidate's children and the
entropy (nats) of the children's renormalized probabilities (NaN when the candidate has no child in the
pool); ``subtree_size``: descendants in the pool; ``subtree_mass``: sum of their cumulative draft
probabilities exp(draft_logp); ``subtree_expanded``: nodes of the subtree (candidate included) with a child
in the pool. Computed by ``featurize.block``.
"""

SUBTREE_FEATURES = ["child_max_q", "child_entropy", "subtree_size", "subtree_mass", "subtree_expanded"]

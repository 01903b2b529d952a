"""Draft features of each first-level candidate and its siblings (docs/design.md, features: draft).

``q``: the drafter's probability of the candidate at the root; ``log_q``; ``sib_rank``: 0 for the most
probable sibling (ties by pool index); ``sib_top_q`` / ``sib_sum_q``: the first level's largest and total
``q``; ``sib_gap``: ``max q - q``; ``sib_entropy``: the entropy (nats) of the first level renormalized.
Computed by ``featurize.block``.
"""

DRAFT_FEATURES = ["q", "log_q", "sib_rank", "sib_top_q", "sib_gap", "sib_sum_q", "sib_entropy"]

"""The columns of the features kernel's block (``featurize.kernel``): every numeric candidate feature, in one
order, and the index of each (the kernel writes through these constants)."""

from __future__ import annotations

from specrank.featurize.context import CONTEXT_FEATURES
from specrank.featurize.draft import DRAFT_FEATURES
from specrank.featurize.rows import ROW_FEATURES
from specrank.featurize.subtree import SUBTREE_FEATURES

NUMERIC_CONTEXT = [f for f in CONTEXT_FEATURES if f != "task"]  # the task is a key column, not a number
BLOCK_FEATURES = DRAFT_FEATURES + SUBTREE_FEATURES + NUMERIC_CONTEXT + ROW_FEATURES  # the kernel's column order
COLUMN = {name: i for i, name in enumerate(BLOCK_FEATURES)}
WIDTH = len(BLOCK_FEATURES)
# column indices the kernel writes (numba freezes these globals); the row sources' logp/gap pairs follow ROW_LOGP
Q = COLUMN["q"]
LOG_Q = COLUMN["log_q"]
SIB_RANK = COLUMN["sib_rank"]
SIB_TOP_Q = COLUMN["sib_top_q"]
SIB_GAP = COLUMN["sib_gap"]
SIB_SUM_Q = COLUMN["sib_sum_q"]
SIB_ENTROPY = COLUMN["sib_entropy"]
CHILD_MAX_Q = COLUMN["child_max_q"]
CHILD_ENTROPY = COLUMN["child_entropy"]
SUBTREE_SIZE = COLUMN["subtree_size"]
SUBTREE_MASS = COLUMN["subtree_mass"]
SUBTREE_EXPANDED = COLUMN["subtree_expanded"]
PROMPT_LEN = COLUMN["prompt_len"]
POSITION = COLUMN["position"]
PREV_ACCEPTED = COLUMN["prev_accepted"]
REPEATS_ROOT = COLUMN["repeats_root"]
ROW_LOGP = COLUMN["cache_logp"]
CACHE_AGE = COLUMN["cache_age"]
PREV_COUNT = COLUMN["prev_tree_root_token_count"]

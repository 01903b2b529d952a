"""The features kernels' "absent" arguments: numba needs an array of the right type where a value is missing.
numpy only, so that building a round's inputs (``featurize.block``) imports no kernel."""

from __future__ import annotations

import numpy as np

NO_ANCESTORS = np.zeros((0, 0), np.int64)
NO_ROWS = np.zeros((0, 0), np.float32)
NO_ROW = np.zeros(0, np.float32)
NO_ANCESTOR = np.zeros(0, np.int64)

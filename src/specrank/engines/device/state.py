"""The columns of ``DeviceRows.state``, one row of scalars per request slot (``engines.device.rows``), shared by
its tensor operations and its CPU kernels (``rows_kernel``)."""

# a slot's scalars, columns of ``DeviceRows.state``: the last continuation (the root of the next step; V: none), the
# previous chain's count of it (NaN: unknown), the previous step's accepted count (NaN: none yet), steps done,
# distinct tokens stored, where the same-token and preceding rows are (the NaN row: none)
STATE = ("continuation", "prev_count", "prev_accepted", "rounds", "count", "same_at", "preceding_at")
CONTINUATION, PREV_COUNT, PREV_ACCEPTED, ROUNDS, COUNT, SAME_AT, PRECEDING_AT = range(len(STATE))

"""The verification sweep: lossy verification rules decoded over a grid, block efficiency against exact distortion
(``sweep``: ``verify_sweep(models, SweepSettings) -> SweepResult``; ``sweep_tables``; ``specrank verify-sweep`` in
``sweep_command``).
"""

from specrank.experiments.verify_sweep.sweep import SweepResult, SweepSettings, verify_sweep

__all__ = ["SweepResult", "SweepSettings", "verify_sweep"]

"""The verification sweep: lossy verification rules decoded over a grid, block efficiency against exact distortion
(``run``, ``tables``; ``specrank verify-sweep`` in ``command``).
"""

"""The tree configurator: each engine tree setting's exact acceptance length from recorded rounds and its predicted
tokens/s (``run``, ``tables``; ``specrank tree-config`` in ``command``).
"""

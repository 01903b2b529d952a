"""The tree configurator: each engine tree setting's exact acceptance length from recorded rounds and its predicted
tokens/s (``configure``: ``tree_config(models, TreeConfigSettings) -> TreeConfigResult``; ``recording_plan``,
``setting_scores``, ``setting_table``, ``setting_figures``; the engines' own tree models in ``specrank.engines``;
``specrank tree-config`` in ``tree_config_command``).
"""

from specrank.experiments.tree_config.configure import TreeConfigResult, TreeConfigSettings, tree_config

__all__ = ["TreeConfigResult", "TreeConfigSettings", "tree_config"]

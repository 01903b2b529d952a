"""The recordings a grid of tree settings needs: one pool per group of settings that one recording holds."""

from __future__ import annotations

from dataclasses import dataclass

from specrank.engines.tree_settings import StaticTreeSetting, setting_order


@dataclass(frozen=True)
class PlannedRecording:
    """One recording the grid needs: its pool (topk, depth, expand), the budget it decodes with, its settings."""

    topk: int
    depth: int
    expand: int
    budget: int
    settings: tuple

    @property
    def name(self) -> str:
        full = isinstance(self.settings[0], StaticTreeSetting)
        return f"{'full-' if full else ''}topk{self.topk}-depth{self.depth}"


def recording_plan(settings) -> dict[str, PlannedRecording]:
    """The recordings a grid needs, by name. Chains (topk 1): one per num_steps. Beams: one per topk, at its deepest
    setting (a beam's first s levels do not depend on later ones, so each shallower setting of that topk is the
    recording truncated; its rounds start where the deepest setting's do).
    Static trees: one pool per recording topk (``StaticTreeSetting.recording_topk``) that expands every node
    to the deepest such tree."""
    groups: dict[tuple, list] = {}
    for st in settings:
        full = isinstance(st, StaticTreeSetting)
        # a decode's rounds start where its own rounds left off: read from a deeper chain's recording, a chain's
        # rounds would start only where the deeper one's do (fewer starts in easy text), so each chain (cheap to
        # record) gets its own; beams of one topk still share one recording
        own = st.num_steps if not full and st.topk == 1 else 0
        groups.setdefault((full, st.recording_topk if full else st.topk, own), []).append(st)
    plan = {}
    for (full, k, _), group in sorted(groups.items()):
        depth = max(st.num_steps for st in group)
        rec = PlannedRecording(k, depth, k ** (depth - 1) if full else k, max(st.budget for st in group),
                               tuple(sorted(group, key=setting_order)))
        plan[rec.name] = rec
    return plan

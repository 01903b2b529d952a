"""A pair of models as the command line spells them (``ModelSpec``), and the pair once loaded (``Models``).

Every stage and experiment that decodes takes one of the two: a spec is checked whole before anything loads and
is what Ray workers receive (they load the models themselves); ``Models`` is what a caller who already holds the
models passes, so that a study's online phase or a test loads them once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specrank.decode.core import parse_device
from specrank.decode.loading.drafters import load_drafter, parse_drafter_spec
from specrank.decode.loading.named_targets import DEFAULT_TARGET, named_target
from specrank.decode.loading.target_passes import Target
from specrank.decode.loading.target_spec import check_target_spec
from specrank.decode.loading.targets import load_target, parse_dtype
from specrank.errors import require
from specrank.rerankers.defaults import DEFAULT_DRAFTER


class Models(NamedTuple):
    """A loaded target and the drafter built for it."""

    target: Target
    drafter: object


@dataclass(frozen=True)
class ModelSpec:
    """The target and the drafter (specs as ``load_target`` and ``load_drafter`` take them) and how they run.

    ``graphs`` and ``threads`` say how passes run, not what they compute: they are no part of a run's identity.
    ``specforge_norm_output`` says which SpecForge wrote an EAGLE-3 head's ``norm_output`` (``after-pr879`` or
    ``before-pr879``); ``eagle3_layers`` chooses an EAGLE-3 head's target layers when its config names none."""

    target: str = DEFAULT_TARGET
    drafter: str = DEFAULT_DRAFTER
    device: str = "cpu"
    dtype: str = "float32"
    graphs: bool | None = None
    eagle3_layers: tuple[int, int, int] | None = None
    specforge_norm_output: str | None = None
    threads: int | None = None  # torch CPU threads of the process that loads them (each Ray worker's, on workers)

    def check(self, here: bool = True) -> ModelSpec:
        """Refuse, before anything loads, a device, dtype, target or drafter that cannot be; returns itself.
        ``here=False`` (Ray workers load the models, perhaps on machines of their own) leaves the target, which
        need not exist on this one, to them."""
        parse_device(self.device)
        parse_dtype(self.dtype)
        if here:
            check_target_spec(self.target)
            if named_target(self.target) is not None or str(self.target).endswith(".gguf"):  # read through gguf
                require("gguf", f"--target {self.target} (a GGUF model)")
        parse_drafter_spec(self.drafter, self.eagle3_layers, self.specforge_norm_output)
        return self

    def load(self) -> Models:
        """The target, then the drafter built for it (on the target's device and dtype)."""
        if self.threads:
            torch.set_num_threads(self.threads)
        target = load_target(self.target, self.device, self.dtype, self.graphs)
        return Models(target, load_drafter(self.drafter, target, self.eagle3_layers, self.specforge_norm_output))


def loaded(models: ModelSpec | Models) -> Models:
    """``models`` loaded when it is a spec; as it is when it already holds models."""
    return models.load() if isinstance(models, ModelSpec) else models

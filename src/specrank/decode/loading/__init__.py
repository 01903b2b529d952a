"""Loading targets (local Hugging Face directories, GGUF files, the embedded default) and drafters."""

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.drafters import SPEC_FORMS, load_drafter
from specrank.decode.loading.named_targets import DEFAULT_TARGET
from specrank.decode.loading.standalone import TokenizerMismatchError
from specrank.decode.loading.target_passes import Target
from specrank.decode.loading.targets import load_target

__all__ = ["DEFAULT_TARGET", "SPEC_FORMS", "ModelLoadError", "Target", "TokenizerMismatchError", "load_drafter",
           "load_target"]

"""Training EAGLE-3-format drafter heads by self-distillation from the target.

``data`` generates and caches the target's continuations with its hidden states, ``vocab``
picks the draft vocabulary, ``unroll`` runs the training-time test, ``train`` the loop with
checkpoints and resume, ``fit`` the whole pipeline behind ``specrank drafter train``,
``diagnostics`` the agreement binned by the target's confidence.
"""

from specrank.drafter_training.data import GenerationSpec, generate_corpus, load_corpus
from specrank.drafter_training.fit import default_head_dir, fit_drafter
from specrank.drafter_training.train import TrainConfig, train

__all__ = ["GenerationSpec", "TrainConfig", "default_head_dir", "fit_drafter", "generate_corpus", "load_corpus", "train"]

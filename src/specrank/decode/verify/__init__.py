"""Verification of a drafted tree: a verifier accepts a root path and emits one continuation.

Every verifier implements ``verify(tree, logits, generator) -> (accepted, continuation)``:
``tree`` is a :class:`VerifyTree`, ``logits`` (n + 1, V) float32 the target rows at the
root (row 0) and at each tree node (row i + 1 for node i), ``generator`` the per-prompt
``torch.Generator``; ``accepted`` holds the pool indices of the accepted path (root
excluded, in path order) and ``continuation`` the emitted non-draft token.
"""

from specrank.decode.verify.exhaustive import ExhaustiveVerifier, Verifier, VerifyTree

__all__ = ["ExhaustiveVerifier", "Verifier", "VerifyTree"]

"""Format 1: a reranker pickled with a metadata header. Unpickling runs code from the file, so it is
refused unless the caller trusts the file (``trust_pickle=True``, ``--trust-pickle``), and then warns."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

from specrank.rerankers.persist import RerankerFileError, check_version

FORMAT = "specrank-reranker/1"
PICKLE_MARK = b"\x80"  # the first byte of every pickle of protocol 2 and later (format 1 used the highest)


class UntrustedPickleError(RerankerFileError):
    """A pickle offered as a reranker without ``trust_pickle``."""


class TrustedPickleWarning(UserWarning):
    """A pickled reranker was loaded because the caller trusted it."""


def require_trust(source, what: str, trust_pickle: bool) -> None:
    """Refuse to unpickle ``source`` unless ``trust_pickle``; warn when it is trusted."""
    if not trust_pickle:
        raise UntrustedPickleError(
            f"{source}: {what}; loading it would run code from it. Pass --trust-pickle (trust_pickle=True)"
            " only for a source you trust, then re-save the reranker with .save() (format 2)")
    warnings.warn(f"{source}: unpickling {what} runs code from it; re-save the reranker with .save() (format 2)",
                  TrustedPickleWarning, stacklevel=4)


def load_pickle(path, trust_pickle: bool = False):
    """The reranker of a format-1 file, only when ``trust_pickle``; any other file is refused unread."""
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(1)
    if head != PICKLE_MARK:
        raise RerankerFileError(f"{path}: not a specrank reranker (format 2 is a directory or a .zip)")
    require_trust(path, "a pickle (reranker format 1)", trust_pickle)
    with open(path, "rb") as fh:
        try:
            payload = pickle.load(fh)
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            raise RerankerFileError(f"{path}: not a specrank reranker ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or not {"estimator", "meta"} <= set(payload):
        raise RerankerFileError(f"{path}: not a specrank reranker file (expected format {FORMAT})")
    est, meta = payload["estimator"], payload["meta"]
    check_version(path, meta["version"])
    est.meta_ = meta
    return est

"""Tracking URIs: the default store, and a reachability check that fails before any work."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_DB = "mlflow.db"
DEFAULT = "default"  # the value of an opt-in ``--tracking-uri`` that names MLflow's default store


class TrackingError(ValueError):
    """The tracking store cannot be used; the message names the URI."""


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI to use; a local path is made absolute.

    None means ``$MLFLOW_TRACKING_URI`` when set (MLflow's convention), else ``sqlite:///<cwd>/mlflow.db``.
    """
    if uri is None or not str(uri).strip():
        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if not uri:
            return f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"
    uri = str(uri).strip()
    scheme = urllib.parse.urlparse(uri).scheme
    if len(scheme) > 1:  # one letter is a Windows drive, not a scheme
        return uri
    path = Path(uri).expanduser().resolve()
    # A bare path names a SQLite file when it looks like one, else a file store directory.
    return f"sqlite:///{path}" if path.suffix in (".db", ".sqlite") else path.as_uri()


def optional_uri(value: str | None) -> str | None:
    """For commands that log only when asked: None (no tracking), or the checked-reachable URI of ``value``
    (``"default"``: MLflow's default store)."""
    if value is None:
        return None
    return check_reachable(resolve_tracking_uri(None if value == DEFAULT else value))


def check_reachable(uri: str, timeout: float = 5.0) -> str:
    """Return ``uri`` if its store can be reached, else raise a one-line TrackingError naming it."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("http", "https"):
        _check_server(uri, timeout)
    elif parsed.scheme == "sqlite":
        _check_parent(Path(uri[len("sqlite:///") :]), uri)
    elif parsed.scheme == "file":
        _check_parent(Path(urllib.request.url2pathname(parsed.path)), uri)
    return uri


def _check_server(uri: str, timeout: float) -> None:
    """Any HTTP answer from ``<uri>/health`` counts as reachable; no answer does not."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return  # the server answered, even if not with 200
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"MLflow tracking server {uri} is unreachable ({reason})") from None


def _check_parent(path: Path, uri: str) -> None:
    if not path.parent.is_dir():
        raise TrackingError(f"tracking URI {uri}: directory {path.parent} does not exist")

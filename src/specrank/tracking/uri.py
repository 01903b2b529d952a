"""Tracking URIs: the default store, and a check that the store can be used, before any work.

Reading (loading a logged model) needs a store that exists, and creates nothing; writing needs one
that can be written. Either way an unusable URI is a one-line ``TrackingError`` naming it.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from specrank.outputs import OutputError, check_output_dir

DEFAULT_DB = "mlflow.db"
SQLITE = "sqlite:///"
SQLITE_MAGIC = b"SQLite format 3\x00"
# Schemes MLflow's tracking store registry knows; the database ones are not probed here.
SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc")
DEFAULT = "default"  # the value of an opt-in ``--tracking-uri`` that names MLflow's default store


class TrackingError(ValueError):
    """The tracking store cannot be used; the message names the URI."""


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI to use; a local path, or a SQLite file given relative to here, is made absolute.

    None means ``$MLFLOW_TRACKING_URI`` when set (MLflow's convention), else ``sqlite:///<cwd>/mlflow.db``.
    """
    if uri is None or not str(uri).strip():
        uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
        if not uri:
            return f"{SQLITE}{Path.cwd().resolve() / DEFAULT_DB}"
    uri = str(uri).strip()
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme == "sqlite" and uri.startswith(SQLITE) and uri != SQLITE:
        return f"{SQLITE}{Path(uri[len(SQLITE):]).expanduser().resolve()}"  # sqlite:///x.db is relative to here
    if len(scheme) > 1:  # one letter is a Windows drive, not a scheme
        return uri
    path = Path(uri).expanduser().resolve()
    # A bare path names a SQLite file when it looks like one, else a file store directory.
    return f"{SQLITE}{path}" if path.suffix in (".db", ".sqlite") else path.as_uri()


def optional_uri(value: str | None) -> str | None:
    """For commands that log only when asked: None (no tracking), or the checked-reachable URI of ``value``
    (``"default"``: MLflow's default store)."""
    if value is None:
        return None
    return check_tracking_uri(resolve_tracking_uri(None if value == DEFAULT else value))


@contextmanager
def tracking_store(uri: str):
    """MLflow's tracking and registry URIs set to ``uri`` for the block, then restored exactly.

    ``mlflow.set_tracking_uri`` also writes ``$MLFLOW_TRACKING_URI`` (for subprocesses), so putting back
    "the previous URI" would pin MLflow's default of that moment (``<cwd>/mlflow.db``) for the rest of the
    process; when nothing was set before, nothing is set after.
    """
    import mlflow

    env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    previous = mlflow.get_tracking_uri() if env["MLFLOW_TRACKING_URI"] else None
    registry = mlflow.get_registry_uri() if env["MLFLOW_REGISTRY_URI"] else None
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(registry)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_tracking_uri(uri: str, timeout: float = 5.0, *, write: bool = True) -> str:
    """Return ``uri`` if its store can be used (``write``: written to; else read, and it must exist),
    else raise a one-line TrackingError naming it."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in SCHEMES:
        raise TrackingError(f"tracking URI {uri}: unknown scheme {parsed.scheme!r}"
                            " (use http(s)://HOST:PORT, sqlite:///FILE.db, file:///DIR or a local path)")
    if parsed.scheme in DATABASES:
        _check_driver(uri)
    if parsed.scheme in ("http", "https"):
        _check_server(uri, timeout)
    elif parsed.scheme == "sqlite":
        _check_sqlite(Path(uri[len(SQLITE):]), uri, write)
    elif parsed.scheme == "file":
        _check_file_store(Path(urllib.request.url2pathname(parsed.path)), uri, write)
    return uri


DATABASES = ("postgresql", "mysql", "mssql")
# pip package of the database drivers SQLAlchemy imports by default, where it differs from the module name
DRIVER_PACKAGES = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]"}


def _check_driver(uri: str) -> None:
    """A database store needs the driver SQLAlchemy picks for its URL: a missing one is named with its package."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        package = DRIVER_PACKAGES.get(exc.name, exc.name)
        raise TrackingError(f"tracking URI {uri}: this store needs the {exc.name} driver "
                            f"(pip install '{package}')") from None
    except (ArgumentError, NoSuchModuleError) as exc:
        raise TrackingError(f"tracking URI {uri}: not a database URL SQLAlchemy knows ({exc})") from None


READ_CALL = "/api/2.0/mlflow/experiments/search?max_results=1"  # the cheapest read every MLflow server answers


def _auth_headers() -> dict:
    """The credentials MLflow's own client would send (``MLFLOW_TRACKING_TOKEN``, or username and password)."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if token:
        return {"Authorization": f"Bearer {token}"}
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _check_server(uri: str, timeout: float) -> None:
    """The server must answer a read call as MLflow does (a JSON object): a web server that is not MLflow, or
    one that refuses the read, is refused here rather than after the work it would have logged."""
    url = uri.rstrip("/") + READ_CALL
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_auth_headers()), timeout=timeout) as resp:
            body = resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise TrackingError(f"MLflow tracking server {uri} refused a read (HTTP {exc.code}; "
                                "credentials in MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD?)") from None
        raise TrackingError(f"tracking URI {uri} answers HTTP but is not an MLflow tracking server "
                            f"(HTTP {exc.code} for {READ_CALL.split('?')[0]})") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"MLflow tracking server {uri} is unreachable ({reason})") from None
    try:
        answer = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict):
        raise TrackingError(f"tracking URI {uri} answers HTTP but is not an MLflow tracking server "
                            f"(no JSON answer to {READ_CALL.split('?')[0]})")


def _check_writable(directory: Path, uri: str) -> None:
    try:
        check_output_dir(directory, what=f"tracking URI {uri}:")
    except OutputError as exc:
        raise TrackingError(str(exc)) from None


def _check_sqlite(path: Path, uri: str, write: bool) -> None:
    if not path.parent.is_dir():
        raise TrackingError(f"tracking URI {uri}: directory {path.parent} does not exist")
    if not path.exists():
        if not write:
            raise TrackingError(f"tracking URI {uri}: no MLflow database at {path}")
        _check_writable(path.parent, uri)
        return
    if not path.is_file():
        raise TrackingError(f"tracking URI {uri}: {path} is not a file")
    try:
        with open(path, "r+b" if write else "rb") as fh:  # r+b: opened for writing, nothing written
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise TrackingError(f"tracking URI {uri}: cannot {'write' if write else 'read'} {path} ({exc.strerror})") from None
    if head and head != SQLITE_MAGIC:
        raise TrackingError(f"tracking URI {uri}: {path} is not a SQLite database")
    if write:
        _check_writable(path.parent, uri)  # SQLite writes its journal beside the database


def _check_file_store(path: Path, uri: str, write: bool) -> None:
    if path.exists() and not path.is_dir():
        raise TrackingError(f"tracking URI {uri}: {path} is not a directory")
    if not write and not path.is_dir():
        raise TrackingError(f"tracking URI {uri}: no MLflow file store at {path}")
    if not path.parent.is_dir():
        raise TrackingError(f"tracking URI {uri}: directory {path.parent} does not exist")
    if write:
        _check_writable(path, uri)

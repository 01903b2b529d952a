"""What a failed command tells its user: one line naming the input and what is wrong with it.

Expected failures are ``ValueError`` subclasses raised where the input is read (``ConfigError``,
``PromptError``, ``SchemaError``, ...) and OS errors about files. The libraries we call raise their own
types; ``user_message`` translates those at the command boundary (``specrank.cli``), naming the library,
and returns None for anything else: a bug, whose traceback is worth seeing.
"""

from __future__ import annotations

# Exception classes of the libraries we call (matched by qualified name, so none is imported here),
# and the name their messages are prefixed with.
LIBRARY_ERRORS = {
    "mlflow.exceptions.MlflowException": "MLflow",
    "lightgbm.basic.LightGBMError": "LightGBM",
    "safetensors._safetensors_rust.SafetensorError": "safetensors",
    "pyarrow.lib.ArrowException": "Parquet",
    "sqlalchemy.exc.SQLAlchemyError": "MLflow store",
    "skops.io.exceptions.UntrustedTypesFoundException": "skops",
    "optuna.exceptions.OptunaError": "Optuna",
}
MAX_MESSAGE = 400  # a response body or a repr can be long; the line stays readable


class CommandError(ValueError):
    """A user-facing error: printed as one line, exit status 2."""


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, cut to ``MAX_MESSAGE`` characters."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def library_of(exc: BaseException) -> str | None:
    """The library name of ``exc`` when its class (or a base) is one of ``LIBRARY_ERRORS``."""
    for cls in type(exc).__mro__:
        name = LIBRARY_ERRORS.get(f"{cls.__module__}.{cls.__qualname__}")
        if name:
            return name
    return None


def os_message(exc: OSError) -> str:
    """``PATH: reason`` for an OS error about a file (permission, not a directory, disk full, ...)."""
    reason = exc.strerror or first_line(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{where}: {reason}"


def user_message(exc: BaseException) -> str | None:
    """The one-line message of an expected failure, or None when ``exc`` is a bug."""
    library = library_of(exc)
    if library is not None:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return f"{library}: {first_line(message)}"
    if isinstance(exc, OSError):
        return os_message(exc)
    if isinstance(exc, ValueError):
        return first_line(exc) or type(exc).__name__
    return None

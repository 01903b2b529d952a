"""The ``specrank`` command line: one subcommand per pipeline stage.

Each subcommand lives in the module ``COMMANDS`` names (a stage's in ``specrank.commands``, an experiment's
beside it in ``specrank.experiments``) and exposes ``add_arguments(parser)`` and ``run(args) -> int``; its
one-line help is in ``COMMANDS``. Only the module of the command being run is
imported (it imports what it uses at its top): ``specrank --help`` imports none, and a stage that needs
torch does not slow down one that does not.

This is the one error boundary: an expected failure (``specrank.errors.user_message``) is printed as
one line ``specrank COMMAND: error: ...`` with exit status 2; anything else is a bug, said in one line
(``specrank.errors.bug_message``) with exit status 1. ``--debug`` or ``SPECRANK_DEBUG=1`` prints the
traceback first.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from contextlib import contextmanager

from specrank.errors import bug_message, user_message

# name: (module, one-line help); the help lives here so that listing the commands imports none of them
COMMANDS = {
    "decode": ("specrank.commands.decode",
               "decode prompts with a target and a drafter, recording each round's pool and target rows"),
    "featurize": ("specrank.commands.featurize",
                  "Featurize a run directory: one row per (round, first-level candidate) with every feature of "
                  "docs/design.md."),
    "train": ("specrank.commands.train",
              "Cross-fit rerankers on a features table; write predictions.parquet (keys + one column per reranker) "
              "and models."),
    "evaluate": ("specrank.commands.evaluate",
                 "Evaluate every selection score offline on a run's recorded rounds, with paired prompt-bootstrap "
                 "intervals."),
    "report": ("specrank.commands.report", "Re-render report.md and figures/ from the tables that 'specrank evaluate' saved."),
    "online": ("specrank.experiments.online.online_command",
               "decode online with selection strategies in the loop; realized vs expected acceptance and speed ratios"),
    "drafter": ("specrank.commands.drafter",
                "Drafter tools: fit-exit-head fits a linear exit head for an early-exit drafter; train trains an "
                "EAGLE-3 head; export writes an EAGLE-3 head for SGLang, vLLM or EAGLE."),
    "verify-sweep": ("specrank.experiments.verify_sweep.sweep_command",
                     "sweep verification rules (tree and chain speculation): block efficiency vs exact distortion, "
                     "logged to MLflow"),
    "demo": ("specrank.experiments.study.demo",
             "run the whole pipeline (decode, featurize, train, evaluate, MLflow) on the embedded default"),
    "study": ("specrank.experiments.study.study_command",
              "the pipeline at scale (decode to a round target, featurize, cross-fit, evaluate, pick and refit a "
              "champion, decode unseen prompts online) -> one results JSON"),
    "tree-config": ("specrank.experiments.tree_config.tree_config_command",
                    "exact acceptance length and predicted tokens/s of SGLang / EAGLE / vLLM tree settings, and the "
                    "best flags"),
}
DEBUG_ENV = "SPECRANK_DEBUG"
MLFLOW_LEVEL_ENV = "MLFLOW_LOGGING_LEVEL"


class UsageError(Exception):
    """A command line argparse refuses; ``prog`` is the (sub)command it was given to."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage block stays in ``--help``)."""

    def error(self, message):
        raise UsageError(self.prog, f"{message} (see {self.prog} --help)")


def _add_debug(parser: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--debug`` on ``parser`` and every subcommand below it (set on any level, it reaches the namespace)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help=f"show the full traceback of an error (also {DEBUG_ENV}=1)")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _add_debug(sub)


def command_of(argv) -> str | None:
    """The command ``argv`` names: its first word that is not an option (``specrank`` itself takes only flags)."""
    return next((str(a) for a in argv if not str(a).startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command listed with its help; only ``command``'s module is imported, for its arguments and run."""
    parser = Parser(prog="specrank", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, text) in COMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    _add_debug(parser, default=False)
    return parser


class _Stdout(logging.Handler):
    """What the library says (logger ``specrank``, INFO and up), printed on the stdout of the moment: a command's
    output is its stages' lines and its own."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), flush=True)


def _say_on_stdout() -> None:
    logger = logging.getLogger("specrank")
    if not any(isinstance(h, _Stdout) for h in logger.handlers):
        logger.addHandler(_Stdout())
    logger.setLevel(logging.INFO)
    logger.propagate = False  # printed once, here, not again by a root handler an embedding program set up


def _error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


@contextmanager
def _mlflow_notices(shown: bool):
    """MLflow's INFO lines (creating a store's tables, ...) kept off stderr for the command unless ``shown``
    (``--debug``) or the user chose a level in ``MLFLOW_LOGGING_LEVEL``: stderr is for errors."""
    if shown or MLFLOW_LEVEL_ENV in os.environ:
        yield
        return
    os.environ[MLFLOW_LEVEL_ENV] = "WARNING"  # read when mlflow is first imported
    logger = logging.getLogger("mlflow")  # and the level of an mlflow imported already
    imported, level = "mlflow" in sys.modules, logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        os.environ.pop(MLFLOW_LEVEL_ENV, None)
        # an mlflow first imported by the command configured itself quiet: back to the level it defaults to
        logger.setLevel(level if imported or "mlflow" not in sys.modules else logging.INFO)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(command_of(argv)).parse_args(argv)
    except ImportError as exc:  # a package every command needs (LightGBM) is missing: one line, not a traceback
        if user_message(exc) is None:
            raise
        return _error("specrank", user_message(exc))
    except UsageError as exc:
        return _error(exc.prog, str(exc))
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    args.argv = argv[argv.index(args.command) + 1:]  # after the command name: for records of the run
    debug = args.debug or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
    _say_on_stdout()
    try:
        with _mlflow_notices(debug):
            return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"specrank {args.command}: interrupted (finished shards are kept)", file=sys.stderr)
        return 130
    except Exception as exc:
        message = user_message(exc)
        if debug:
            traceback.print_exc()
        if message is None:
            print(f"specrank {args.command}: {bug_message(exc, '--debug', DEBUG_ENV)}", file=sys.stderr)
            return 1
        return _error(f"specrank {args.command}", message)


if __name__ == "__main__":
    sys.exit(main())

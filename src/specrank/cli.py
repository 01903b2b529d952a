"""The ``specrank`` command line: one subcommand per pipeline stage.

Each subcommand lives in ``specrank.commands.<name>`` and exposes
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported lazily so that ``specrank --help`` stays fast and a
stage that needs torch does not slow down one that does not.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "decode": "specrank.commands.decode",
    "featurize": "specrank.commands.featurize",
    "train": "specrank.commands.train",
    "evaluate": "specrank.commands.evaluate",
    "report": "specrank.commands.report",
    "online": "specrank.commands.online",
    "drafter": "specrank.commands.drafter",
    "verify-sweep": "specrank.commands.verify_sweep",
    "demo": "specrank.commands.demo",
}


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _available():
    for name, module in COMMANDS.items():
        try:
            yield name, importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real missing dependency inside the module
                raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specrank", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in _available():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (CommandError, ValueError, FileNotFoundError, KeyError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"specrank {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specrank {args.command}: interrupted (finished shards are kept)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `tierlab` command: one entry point, one module per subcommand.

A subcommand is a module in this package with `register(subparsers)` (which adds
its parser and sets `run`) and `run(args) -> int`. To add one (the paired runner,
the VM lab), write the module and add its name to COMMANDS; nothing else changes.
Modules import heavy libraries (matplotlib) inside run(), so `tierlab --help` and
light subcommands start fast.

Errors the user can cause end as one line on stderr and exit status 2; a failed
gate is exit status 1 (see report.py)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Sequence

from tierlab import LabError

COMMANDS = ["report", "validate", "profile", "pair", "gate", "crash", "vm"]


class LabArgumentParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = LabArgumentParser(
        prog="tierlab",
        description="The tierfs lab: compare runs, validate results (and, later, run "
                    "paired A/B runs and the VM lab).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"tierlab.{name}").register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except LabError as e:
        # A subcommand with subcommands of its own names them (error_prefix).
        print(f"tierlab {getattr(args, 'error_prefix', args.command)}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tierlab {getattr(args, 'error_prefix', args.command)}: interrupted", file=sys.stderr)
        return 130

"""`tierlab validate FILE...`: check results documents against the schema (and the
consistency rules in schema.py). Prints one line per file; exit 0 when all pass."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tierlab import LabError
from tierlab import schema


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="check results documents against the schema",
                       description=__doc__)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    bad = 0
    for f in args.files:
        try:
            schema.load(f)
            print(f"{f}: ok")
        except LabError as e:
            print(f"{e}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0

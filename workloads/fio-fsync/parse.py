#!/usr/bin/python3
"""Parser of fio-fsync: fio json+ output -> results document (ops write, fsync)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "results"))
from tierlab import fio  # noqa: E402

if __name__ == "__main__":
    fio.parse_main(prog="fio-fsync/parse.py", folder=HERE,
                   op_names={"write": "write", "sync": "fsync"})

#!/usr/bin/python3
"""Parser of fio-randrw: fio json+ output -> results document (ops read, write)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "results"))
from tierlab import fio  # noqa: E402

if __name__ == "__main__":
    fio.parse_main(prog="fio-randrw/parse.py", folder=HERE,
                   op_names={"read": "read", "write": "write"})

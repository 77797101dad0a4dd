#!/usr/bin/python3
"""Parser of syncfs: raw samples (OUT.raw.json) -> results document."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "results"))
from tierlab import workload  # noqa: E402

if __name__ == "__main__":
    workload.parse_main("syncfs/parse.py", "syncfs")

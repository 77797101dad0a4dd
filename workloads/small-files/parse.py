#!/usr/bin/python3
"""Parser of small-files: raw samples (OUT.raw.json) -> results document."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "results"))
from tierlab import workload  # noqa: E402

if __name__ == "__main__":
    workload.parse_main("small-files/parse.py", "small-files")

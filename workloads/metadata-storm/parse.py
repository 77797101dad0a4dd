#!/usr/bin/python3
"""Parser of metadata-storm: raw samples (OUT.raw.json) -> results document."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "results"))
from tierlab import workload  # noqa: E402

if __name__ == "__main__":
    workload.parse_main("metadata-storm/parse.py", "metadata-storm")

"""pytest setup for the workload folders' tests: makes the results tooling
(results/tierlab) importable, as the folders' own scripts do."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "results"))

"""pytest setup for the whole tree: makes the results tooling (results/tierlab)
importable from every folder's tests, as the lab's own scripts do."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "results"))

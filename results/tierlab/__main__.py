"""`python3 -m tierlab` entry point (build/bin/tierlab runs this)."""

import sys

from tierlab.cli import main

sys.exit(main())

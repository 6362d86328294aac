"""`python -m harness.cli`: the same as the `cl-bench` console script."""
import sys

from . import main

sys.exit(main())

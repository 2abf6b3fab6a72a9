"""`python -m pykernel ...` = the `pykernel` command (for checkouts that are not pip-installed)."""
import sys

from .cli import main

sys.exit(main())

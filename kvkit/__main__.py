"""``python -m kvkit``: the same command line as the ``kvkit`` console script."""

import sys

from kvkit.cli import main

if __name__ == "__main__":
    sys.exit(main())

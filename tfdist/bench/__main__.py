"""`python -m tfdist.bench`: see `tfdist.bench.cli`."""

import sys

from tfdist.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m tfdist.bench`: see `tfdist.bench.commands`."""

import sys

from tfdist.bench.commands import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m tfdist.launch`: see `tfdist.launch`."""

import sys

from tfdist.launch.arguments import main

sys.exit(main())

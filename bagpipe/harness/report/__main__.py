"""``python -m bagpipe.harness.report``: a suite's results as CSV, figure and markdown."""

import sys

from bagpipe.harness.report.fig7 import main

sys.exit(main())

"""``python -m bagpipe.harness.report <suite>``: a suite's results as CSV, figure and markdown."""

import sys

from bagpipe.harness.report.cli import main

sys.exit(main())

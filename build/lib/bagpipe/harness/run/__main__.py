"""``python -m bagpipe.harness.run``: one training run, or with ``-m``/a suite a sweep of them."""

from bagpipe.harness.run.train import main

main()

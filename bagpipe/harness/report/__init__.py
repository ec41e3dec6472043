"""Reports: one module per figure family, the cost model, and the plotting they share.

``python -m bagpipe.harness.report ...`` is the command line.
"""

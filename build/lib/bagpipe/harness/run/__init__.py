"""Running experiments: the Hydra entry point and its config schemas, the training loop every
system runs under, evaluation, sweeps, recovery from role failures, and preemption.

``python -m bagpipe.harness.run ...`` is the command line (``train.main``).
"""

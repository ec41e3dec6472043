"""Running experiments: the training loop, evaluation, and (beside them) tracking and reports.

:func:`run_training` drives any :class:`~bagpipe.core.interface.System` through the same data order,
timing and evaluation cadence; :func:`evaluate` scores a model state identically for every system.
"""

from bagpipe.harness.run.evaluate import EvalScores, Evaluator, evaluate, roc_auc
from bagpipe.harness.run.runner import (
    EvalPoint,
    RunCallback,
    RunConfig,
    RunResult,
    run_training,
    summarize,
)

__all__ = [
    "EvalPoint",
    "EvalScores",
    "Evaluator",
    "RunCallback",
    "RunConfig",
    "RunResult",
    "evaluate",
    "roc_auc",
    "run_training",
    "summarize",
]

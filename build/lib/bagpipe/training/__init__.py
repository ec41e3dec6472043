"""What every system computes the same way, and the in-process reference that computes only that.

``step`` holds the per-slice forward/backward, loss and SGD conventions every system reuses;
``start`` the initial (or resumed) weights and the stream of batches from a resumed step on;
``local`` (:class:`LocalSystem`) the synchronous single-process reference system, the ground truth
of every equivalence test.
"""

from bagpipe.training.local import LocalSystem
from bagpipe.training.start import TrainingStream, start_dense_model, start_table, start_tables
from bagpipe.training.step import (
    SliceGradients,
    bce_loss_sum,
    forward_backward,
    pooled_from_rows,
    sgd_dense_,
    sgd_rows_,
    slice_loss,
    unique_rows,
)

__all__ = [
    "LocalSystem",
    "SliceGradients",
    "TrainingStream",
    "bce_loss_sum",
    "forward_backward",
    "pooled_from_rows",
    "sgd_dense_",
    "sgd_rows_",
    "slice_loss",
    "start_dense_model",
    "start_table",
    "start_tables",
    "unique_rows",
]

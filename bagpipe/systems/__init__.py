"""In-process systems and the training math all systems share.

``local`` (:class:`LocalSystem`) is the synchronous single-process reference; ``common`` holds the
per-slice forward/backward, loss and SGD conventions every distributed system reuses; ``start`` the
initial (or resumed) weights; ``parameter_server`` (:class:`ParameterServerSystem`) the driver side
of the systems built from server shards and trainers (``sync_ps``, HET, FAE).
"""

from bagpipe.systems.common import (
    SliceGradients,
    bce_loss_sum,
    forward_backward,
    pooled_from_rows,
    sgd_dense_,
    sgd_rows_,
    slice_loss,
    unique_rows,
)
from bagpipe.systems.local import LocalSystem
from bagpipe.systems.parameter_server import ParameterServerSystem

__all__ = [
    "LocalSystem",
    "ParameterServerSystem",
    "SliceGradients",
    "bce_loss_sum",
    "forward_backward",
    "pooled_from_rows",
    "sgd_dense_",
    "sgd_rows_",
    "slice_loss",
    "unique_rows",
]

"""The substrate every system shares: the System interface and registry, batches, the Meter and the
link model, and the process roles that multi-process systems are made of."""

from bagpipe.core.batch import (
    Batch,
    DatasetSchema,
    batch_from_arrays,
    global_ids,
    ids_matrix,
    split_batch,
)
from bagpipe.core.interface import (
    ModelState,
    OptimConfig,
    PhaseInfo,
    StepResult,
    System,
    TrainContext,
)
from bagpipe.core.link import Link, LinkConfig, Network
from bagpipe.core.meter import LinkKind, Meter, Phase, StepRecord
from bagpipe.core.registry import UnknownSystemError, load_system, registered_systems

__all__ = [
    "Batch",
    "DatasetSchema",
    "Link",
    "LinkConfig",
    "LinkKind",
    "Meter",
    "ModelState",
    "Network",
    "OptimConfig",
    "Phase",
    "PhaseInfo",
    "StepRecord",
    "StepResult",
    "System",
    "TrainContext",
    "UnknownSystemError",
    "batch_from_arrays",
    "global_ids",
    "ids_matrix",
    "load_system",
    "registered_systems",
    "split_batch",
]

"""The substrate every system shares: the System interface and registry, batches, the Meter, the
emulated network (``net``: topology, back-ends, the wire), and the process roles that multi-process
systems are made of."""

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
from bagpipe.core.meter import LinkKind, Meter, Phase, StepRecord
from bagpipe.core.net.topology import Nic, Topology
from bagpipe.core.net.wire import NetworkConfig
from bagpipe.core.registry import UnknownSystemError, load_system, registered_systems

__all__ = [
    "Batch",
    "DatasetSchema",
    "LinkKind",
    "Meter",
    "ModelState",
    "NetworkConfig",
    "Nic",
    "OptimConfig",
    "Phase",
    "PhaseInfo",
    "StepRecord",
    "StepResult",
    "System",
    "Topology",
    "TrainContext",
    "UnknownSystemError",
    "batch_from_arrays",
    "global_ids",
    "ids_matrix",
    "load_system",
    "registered_systems",
    "split_batch",
]

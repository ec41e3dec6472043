"""TorchRec sharding baseline: ``DistributedModelParallel`` over the trainers (system ``torchrec``).

* ``plan.py``: the sharding plan (manual helpers or TorchRec's planner, CPU row-wise sharder);
* ``layout.py``: all-to-all bytes per step, exactly, from the plan and the batch;
* ``trainer.py``: one trainer role (DMP, optimizers, gradient scaling, shards);
* ``system.py``: the driver, :class:`TorchRecSharding`.
"""

from baselines.torchrec_sharding.plan import ShardingKnobs
from baselines.torchrec_sharding.system import TorchRecSharding

__all__ = ["ShardingKnobs", "TorchRecSharding"]

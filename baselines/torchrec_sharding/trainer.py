"""One TorchRec trainer: its shards of the tables (via ``DistributedModelParallel``) and a dense replica.

Built in its own process by the driver (``Deployment.remote``); the T trainers form one gloo group
(NCCL when CUDA is available) in which TorchRec runs its all-to-alls and DDP its all-reduce. Both go
through the wire like every other system's traffic: TorchRec's collectives are routed there
(``collectives.wire_torch_collectives``) and DDP's buckets by its comm hook, so the bytes counted
are the tensors really sent, and under ``netns`` the kernel carries them between the hosts.

**Gradient scaling (why the result equals ``local``).** ``local`` steps with the gradient of the
mean BCE over the global batch ``B_g``, i.e. the SUM over trainers of ``g_r = grad(bce_sum_r / B_g)``.
TorchRec averages instead of summing, twice: DDP divides the all-reduced dense (and data-parallel
table) gradients by T, and with ``comm_ops.GRADIENT_DIVISION`` (TorchRec's default, set explicitly
here) the backward of every model-parallel all-to-all / reduce-scatter divides the pooled-embedding
gradients by T. Each trainer therefore back-propagates ``T * bce_sum_r / B_g`` = the mean BCE over
its own slice (slices are equal, ``B_g = T * B``): averaged over T ranks that is exactly
``sum_r g_r``. Both averaging paths see the same factor, so every table type and the dense part
get the ``local`` gradient; the reported loss is ``sum_r bce_sum_r / B_g``.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import Optimizer
from torchrec.distributed import comm_ops
from torchrec.distributed.model_parallel import (
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.embedding_configs import PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedTensor

from bagpipe.core import collectives, runtime
from bagpipe.core.batch import Batch
from bagpipe.core.device import charge_batch_copy, move_batch, own_gpus, trainer_device
from bagpipe.core.interface import TrainerSpec
from bagpipe.core.meter import Phase, StepRecord
from bagpipe.core.roles import Rendezvous
from bagpipe.models import RecModel, table_dim
from bagpipe.training.start import start_dense_model, start_tables
from bagpipe.training.step import backward_timing_sync, bce_loss_sum
from baselines.torchrec_sharding.layout import (
    rank_load,
    table_layouts,
)
from baselines.torchrec_sharding.plan import (
    FlexibleEBCSharder,
    ShardingKnobs,
    describe_plan,
    manual_plan,
    planner_plan,
)

EBC_PATH = "ebc"
PIPELINE_PHASE = "train_pipeline"  # the pipeline runs a whole step in one call

# TorchRec 1.9.2 itself calls torch APIs that torch has since deprecated (DDP's
# ``broadcast_buffers``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``): each notice points
# into TorchRec, changes nothing, and would print in every trainer, so those notices alone are off.
for _notice in (
    r"`broadcast_buffers` is deprecated",
    r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
    r"`torch\.distributed\.reduce_scatter_tensor` is deprecated",
):
    warnings.filterwarnings("ignore", message=_notice, category=FutureWarning)


class WiredDataParallel(DefaultDataParallelWrapper):
    """TorchRec's DDP for the unsharded part, its buckets all-reduced through the wire.

    Averaged, as TorchRec's own DDP does: the gradient scaling above is built on that mean. The
    initial broadcast from rank 0 is skipped, as for every system's replicas
    (``bagpipe.training.step.replicate_dense``): every rank loads the same seeded weights.
    """

    def __init__(self) -> None:
        super().__init__(ddp_kwargs={"init_sync": False})

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        super().wrap(dmp, env, device)
        wrapped = dmp._dmp_wrapped_module
        if isinstance(wrapped, DistributedDataParallel):
            wrapped.register_comm_hook(None, collectives.ddp_hook(average=True))


class ShardedRecModel(nn.Module):
    """The EBC and the dense part as one module, shaped as TorchRec's train pipeline wants.

    ``forward(batch) -> (loss_to_backprop, (bce_sum, logits))``; see the module docstring for why the
    back-propagated loss is the slice mean.
    """

    def __init__(
        self, ebc: EmbeddingBagCollection, dense: RecModel, feature_names: tuple[str, ...]
    ) -> None:
        super().__init__()
        self.ebc = ebc
        self.dense = dense
        self.feature_names = feature_names

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        keyed: KeyedTensor = self.ebc(batch.sparse_features)
        # A sharded EBC orders its output keys by sharding group, not by table: select by name.
        by_feature = keyed.to_dict()
        pooled = torch.stack([by_feature[name] for name in self.feature_names], dim=1)
        logits = self.dense(batch.dense_features, pooled)
        bce_sum = bce_loss_sum(logits, batch.labels)
        slice_mean = bce_sum / batch.labels.shape[0]
        return slice_mean, (bce_sum.detach(), logits.detach())


class TorchRecTrainer:
    """Rank ``rank`` of the T TorchRec trainers (a ``Deployment`` role object).

    Args:
        rank: this trainer's rank in the gloo group.
        group: the rendezvous of the trainers' group (``Deployment.new_group``).
        spec: the run's settings (the same :class:`TrainerSpec` every system's trainers get).
        knobs: the sharding knobs (planner or hand plan, kernel).
        use_pipeline: train through TorchRec's ``TrainPipelineSparseDist``.
            at step 0.
    """

    def __init__(
        self,
        rank: int,
        group: Rendezvous,
        spec: TrainerSpec,
        knobs: ShardingKnobs,
        use_pipeline: bool,
    ) -> None:
        self.rank = rank
        self.world = group.world_size
        self.spec = spec
        self.knobs = knobs
        collectives.join_group(group, rank)
        collectives.wire_torch_collectives()  # TorchRec's all-to-alls go through the wire
        comm_ops.set_gradient_division(True)
        self.device = _device_for(spec.device, rank, self.world)
        # TorchRec's collectives: NCCL among GPUs, else the trainers' gloo group itself.
        group_or_none = (
            dist.new_group(backend="nccl") if self.device.type == "cuda" else dist.group.WORLD
        )
        assert isinstance(group_or_none, dist.ProcessGroup)
        self.group: dist.ProcessGroup = group_or_none
        dim = table_dim(spec.model)
        self.dim = dim

        configs = spec.schema.embedding_configs(dim)
        for config in configs:
            config.pooling = PoolingType.SUM
        ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        if knobs.kernel == "fused":
            apply_optimizer_in_backward(
                torch.optim.SGD, ebc.parameters(), {"lr": spec.optim.embedding_lr}
            )
        start = spec.resume_state
        dense = start_dense_model(spec.model, spec.schema, spec.seed, start)
        model = ShardedRecModel(ebc, dense, spec.schema.feature_names)
        self.dense = model.dense

        sharder = FlexibleEBCSharder(knobs.kernel)
        local_batch = spec.global_batch_size // self.world
        if knobs.uses_planner:
            module_plan = planner_plan(
                model,
                EBC_PATH,
                knobs,
                self.world,
                sharder,
                self.device.type,
                local_batch,
                self.group,
            )
        else:
            module_plan = manual_plan(ebc, knobs, self.world, sharder, self.device.type)
        self.plan = module_plan
        self.dmp = DistributedModelParallel(
            model,
            device=self.device,
            env=ShardingEnv.from_process_group(self.group),
            plan=ShardingPlan({EBC_PATH: module_plan}),
            sharders=[sharder],
            data_parallel_wrapper=WiredDataParallel(),
        )
        shapes = {c.name: (c.num_embeddings, c.embedding_dim) for c in configs}
        self.layouts = table_layouts(module_plan, shapes, spec.schema.table_names, self.world)
        self._load_tables(start_tables(spec.schema, dim, spec.seed, start))
        self.optimizer = self._build_optimizer()

        self._pipeline: TrainPipelineSparseDist | None = None
        self._received: deque[Batch] = deque()
        self._next_step = spec.resume.step if spec.resume is not None else 0
        if use_pipeline:
            self._pipeline = TrainPipelineSparseDist(self.dmp, self.optimizer, self.device)

    # ----------------------------------------------------------------------------- set-up
    def _named_table_tensors(self) -> Iterator[tuple[str, Any]]:
        """``(table name, tensor or ShardedTensor)`` of every table in this rank's state dict."""
        suffix = ".weight"
        for key, value in self.dmp.state_dict().items():
            marker = "embedding_bags."
            if marker in key and key.endswith(suffix):
                yield key.split(marker, 1)[1][: -len(suffix)], value

    @torch.no_grad()
    def _load_tables(self, full: dict[str, torch.Tensor]) -> None:
        """Write this rank's pieces of the full tables into its shards.

        ``full`` is the seeded start every system shares, or a checkpoint's tables.
        """
        for name, tensor in self._named_table_tensors():
            for offsets, local in _local_pieces(tensor):
                rows, cols = local.shape
                local.copy_(
                    full[name][offsets[0] : offsets[0] + rows, offsets[1] : offsets[1] + cols]
                )

    def _build_optimizer(self) -> Optimizer:
        """Fused tables update in backward; everything else steps with plain SGD here."""
        params = dict(in_backward_optimizer_filter(self.dmp.named_parameters()))
        tables = {k: p for k, p in params.items() if "embedding_bags." in k}
        dense = {k: p for k, p in params.items() if k not in tables}
        optimizers: list[Any] = [self.dmp.fused_optimizer]
        lrs = {
            "tables": (tables, self.spec.optim.embedding_lr),
            "dense": (dense, self.spec.optim.dense_lr),
        }
        for group_params, lr in lrs.values():
            if group_params:
                optimizers.append(
                    KeyedOptimizerWrapper(
                        group_params, lambda ps, lr=lr: torch.optim.SGD(ps, lr=lr)
                    )
                )
        return CombinedOptimizer(optimizers)

    # ----------------------------------------------------------------------------- training
    def train_step(self, step: int, slices: list[Batch]) -> tuple[float, StepRecord]:
        """Train on this rank's slice of global batch ``step``; return ``(bce_sum, record)``.

        ``slices`` are this rank's slices of the batches it has not received yet, in order: just
        batch ``step`` without the pipeline; with it, batches ``0, 1, 2`` at step 0 and ``step + 2``
        afterwards (TorchRec's pipeline holds two batches ahead; fewer at the end of the data).
        """
        if step != self._next_step:
            raise ValueError(f"trainer_{self.rank}: got step {step}, expected {self._next_step}")
        self._next_step += 1
        meter = runtime.current().meter
        self._received.extend(slices)
        if not self._received:
            raise ValueError(f"trainer_{self.rank}: no data for step {step}")
        batch = self._received.popleft()
        if self._pipeline is None:
            with meter.phase(Phase.FORWARD):
                loss, (bce_sum, _) = self.dmp(move_batch(batch, self.device, meter))
            with meter.phase(Phase.BACKWARD):
                self.optimizer.zero_grad()
            backward_timing_sync(loss, meter)  # DDP's wait for the dense all-reduce is sync
            with meter.phase(Phase.OPTIMIZER):
                self.optimizer.step()
        else:
            # One call runs input dist of the next batch, forward, backward and the update; the
            # pipeline copies each new slice to the device itself.
            for piece in slices:
                charge_batch_copy(piece, self.device, meter)
            with meter.phase(PIPELINE_PHASE):
                bce_sum, _ = self._pipeline.progress(iter(list(slices)))
        return float(bce_sum), meter.end_step()

    # ----------------------------------------------------------------------------- state
    def table_pieces(self) -> dict[str, list[tuple[tuple[int, int], torch.Tensor]]]:
        """This rank's pieces of every table: ``name -> [((row_off, col_off), tensor)]``.

        Data-parallel tables (identical replicas) are returned by rank 0 only.
        """
        out: dict[str, list[tuple[tuple[int, int], torch.Tensor]]] = {}
        for name, tensor in self._named_table_tensors():
            pieces = [
                (offsets, local.detach().cpu().clone()) for offsets, local in _local_pieces(tensor)
            ]
            replicated = isinstance(tensor, torch.Tensor) and not hasattr(tensor, "local_shards")
            if replicated and self.rank != 0:
                continue
            out[name] = pieces
        return out

    def state_devices(self) -> dict[str, str]:
        """TorchRec keeps the dense replica and this rank's table shards on one device."""
        return {"dense": str(next(self.dense.parameters()).device), "tables": str(self.device)}

    def dense_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.dense.state_dict().items()}

    def plan_description(self) -> dict[str, Any]:
        """The plan as strings, per-rank storage, and how many modules the pipeline rewrote."""
        # ``_pipelined_modules`` is TorchRec's own record of the sharded modules whose input dist
        # it runs ahead; 0 would mean the pipeline fell back to plain forward calls.
        pipelined = len(getattr(self._pipeline, "_pipelined_modules", ()))
        return {
            "plan": describe_plan(self.plan),
            "load": rank_load(self.layouts, self.world),
            "pipelined_modules": pipelined,
        }

    def close(self) -> None:
        """Leave the trainers' group (DMP holds no other resources)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def _device_for(device: str, rank: int, world: int) -> torch.device:
    """``cuda:rank`` for ``device='cuda'``, which needs a GPU per trainer: TorchRec's all-to-alls
    run on NCCL, which refuses two ranks on one GPU, and gloo has no all-to-all of device tensors."""
    if device == "cpu":
        return torch.device("cpu")
    if not own_gpus(world):
        raise ValueError(
            f"torchrec: device=cuda needs a GPU per trainer (NCCL all-to-alls); {world} trainers, "
            f"{torch.cuda.device_count()} GPUs"
        )
    return trainer_device(device, rank, world)


def _local_pieces(tensor: Any) -> list[tuple[tuple[int, int], torch.Tensor]]:
    """``[((row_off, col_off), local tensor)]`` of a ShardedTensor, or the whole plain tensor."""
    if hasattr(tensor, "local_shards"):
        return [
            ((shard.metadata.shard_offsets[0], shard.metadata.shard_offsets[1]), shard.tensor)
            for shard in tensor.local_shards()
        ]
    return [((0, 0), tensor)]

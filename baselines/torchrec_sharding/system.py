"""``torchrec``: the tables sharded across the trainers by TorchRec's ``DistributedModelParallel``.

The driver spawns T trainer roles (``bagpipe.core.roles``); each builds the same model, joins the
trainers' gloo group and lets TorchRec shard the ``EmbeddingBagCollection`` by the plan (see
``plan.py``). Every step the driver sends each trainer its slice of the global batch (plus, with
``use_pipeline``, the slices TorchRec's ``TrainPipelineSparseDist`` wants ahead of time); the
trainers run TorchRec's all-to-alls and DDP's all-reduce among themselves. Semantics equal
``local``'s exactly (``trainer.py`` explains the gradient scaling).

Resumable (``ctx.resume``): each trainer writes its shards from the checkpoint's full tables and
loads the dense part before DMP wraps it; plain SGD keeps no optimizer state, so a resumed run
continues bit-identical to an uninterrupted one. A killed trainer takes its shards with it: the
whole job restarts from the last checkpoint (``bagpipe.harness.run.recovery``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from bagpipe.core.batch import Batch, split_batch
from bagpipe.core.interface import ModelState, StepResult, System, TrainContext
from bagpipe.core.meter import LinkKind
from bagpipe.core.roles import Deployment, trainer_state_devices
from bagpipe.core.runtime import merge_trainer_records
from bagpipe.core.source import BatchSource
from bagpipe.models import table_dim
from baselines.torchrec_sharding.plan import ShardingKnobs
from baselines.torchrec_sharding.trainer import TorchRecTrainer

PIPELINE_DEPTH = 2  # batches TrainPipelineSparseDist holds beyond the current one


class TorchRecSharding(System):
    """TorchRec DMP over T trainers (knobs: see :class:`~.plan.ShardingKnobs`).

    Args:
        num_trainers: T, the trainers sharing the tables.
        sharding: ``auto`` (planner) or ``table_wise`` / ``row_wise`` / ``column_wise`` /
            ``data_parallel`` for every table.
        kernel: ``auto`` (fused where the table width allows it, else dense), ``fused`` (SGD inside
            backward, FBGEMM TBE) or ``dense``.
        use_pipeline: train through ``TrainPipelineSparseDist`` (input dist one batch ahead).
        planner: plan a named ``sharding`` with TorchRec's planner rather than by hand.
        min_partition: smallest column-wise shard width.
        step_timeout_s: longest a step may take before the run fails.
    """

    name = "torchrec"
    supports_resume = True

    def __init__(
        self,
        num_trainers: int = 2,
        sharding: str = "auto",
        kernel: str = "auto",
        use_pipeline: bool = True,
        planner: bool = False,
        min_partition: int | None = None,
        step_timeout_s: float = 300.0,
    ) -> None:
        if num_trainers < 1:
            raise ValueError(f"system.num_trainers must be >= 1, got {num_trainers}")
        self.num_trainers = num_trainers
        self.knobs = ShardingKnobs(sharding, kernel, planner, min_partition)
        self.use_pipeline = use_pipeline
        self.step_timeout_s = step_timeout_s
        self._ctx: TrainContext | None = None
        self._deployment: Deployment | None = None
        self._trainers: list[Any] = []
        self._source: BatchSource | None = None
        self._next_step = 0
        self._sent_until = 0  # batches [0, _sent_until) have been sent to the trainers
        self._ahead: deque[Batch] = deque()  # sent ahead (pipeline), not yet trained

    def reads_ahead(self) -> int:
        """The batches ``TrainPipelineSparseDist`` holds beyond the current one."""
        return PIPELINE_DEPTH if self.use_pipeline else 0

    def setup(self, ctx: TrainContext) -> None:
        if ctx.global_batch_size % self.num_trainers:
            raise ValueError(
                f"global_batch_size {ctx.global_batch_size} does not split into "
                f"system.num_trainers={self.num_trainers} equal slices"
            )
        self.knobs = self.knobs.for_table_dim(table_dim(ctx.model))
        self.knobs.check_table_dim(table_dim(ctx.model), self.num_trainers)
        self._ctx = ctx
        self._source = ctx.source
        # A resumed run trains source[resume.step], source[resume.step + 1], ... (the runner's
        # numbering); the step counters here and in the trainers start there.
        first_step = ctx.resume.step if ctx.resume is not None else 0
        self._next_step = self._sent_until = first_step
        self._ahead.clear()
        roles = [f"trainer_{k}" for k in range(self.num_trainers)]
        self._deployment = Deployment(roles, network=ctx.network)
        spec = ctx.trainer_spec()
        try:
            group = self._deployment.new_group("trainers", self.num_trainers)
            self._trainers = [
                self._deployment.remote(
                    role, TorchRecTrainer, rank, group, spec, self.knobs, self.use_pipeline
                )
                for rank, role in enumerate(roles)
            ]
            # Building a trainer runs collectives (planner, DMP): wait for all of them together.
            self._deployment.wait([t.ready for t in self._trainers])
        except BaseException:
            self.close()
            raise

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, deployment = self._require_setup()
        if batch.labels.shape[0] != ctx.global_batch_size:
            raise ValueError(
                f"step {step}: batch of {batch.labels.shape[0]} examples, but global_batch_size "
                f"is {ctx.global_batch_size}"
            )
        new_batches = self._batches_to_send(step, batch)
        per_rank: list[list[Batch]] = [[] for _ in self._trainers]
        for global_batch in new_batches:
            for rank, piece in enumerate(split_batch(global_batch, self.num_trainers)):
                per_rank[rank].append(piece)
        futures = [
            trainer.rpc_async(kind=LinkKind.DATA).train_step(step, pieces)
            for trainer, pieces in zip(self._trainers, per_rank, strict=True)
        ]
        results = deployment.wait(futures, timeout_s=self.step_timeout_s)
        record = merge_trainer_records([record for _, record in results])
        loss = sum(bce_sum for bce_sum, _ in results) / ctx.global_batch_size
        return StepResult(loss=loss, record=record)

    def _batches_to_send(self, step: int, batch: Batch) -> list[Batch]:
        """This step's batch, or with the pipeline every batch up to ``step + PIPELINE_DEPTH``.

        Batches sent ahead come from the context's source; when their turn comes, the batch the
        runner passes must be the same one (else the pipeline would train on other data).
        """
        if step != self._next_step:
            raise ValueError(
                f"torchrec trains batches in order: expected step {self._next_step}, got {step}"
            )
        self._next_step += 1
        if not self.use_pipeline:
            return [batch]
        assert self._source is not None
        if self._ahead:
            expected = self._ahead.popleft()
            if not _same_batch(expected, batch):
                raise ValueError(
                    f"step {step}: the batch differs from source[{step}] sent ahead to the pipeline"
                )
        out = [batch] if step == self._sent_until else []
        last = min(step + PIPELINE_DEPTH, len(self._source) - 1)
        for index in range(max(self._sent_until, step + 1), last + 1):
            ahead = self._source[index]
            self._ahead.append(ahead)
            out.append(ahead)
        self._sent_until = max(self._sent_until, last + 1, step + 1)
        return out

    def state_devices(self) -> dict[str, str]:
        return trainer_state_devices(self.name, self._deployment, self._trainers)

    def full_state(self) -> ModelState:
        ctx, deployment = self._require_setup()
        pieces_per_rank = deployment.wait([t.rpc_async().table_pieces() for t in self._trainers])
        tables: dict[str, torch.Tensor] = {}
        for name, rows in zip(ctx.schema.table_names, ctx.schema.table_sizes, strict=True):
            full = torch.empty(rows, table_dim(ctx.model))
            covered = torch.zeros(rows, table_dim(ctx.model), dtype=torch.bool)
            for pieces in pieces_per_rank:
                for (row_off, col_off), tensor in pieces.get(name, []):
                    block = (
                        slice(row_off, row_off + tensor.shape[0]),
                        slice(col_off, col_off + tensor.shape[1]),
                    )
                    full[block] = tensor
                    covered[block] = True
            # A coverage mask, not a NaN sentinel: a diverged model's NaN weights are its state.
            if not bool(covered.all()):
                raise RuntimeError(f"table {name}: the trainers' shards do not cover it")
            tables[name] = full
        dense = deployment.wait(self._trainers[0].rpc_async().dense_state())
        return ModelState(tables=tables, dense=dense)

    def stats(self) -> dict[str, Any]:
        if self._deployment is None or not self._trainers:
            return {}
        described = self._deployment.wait(self._trainers[0].rpc_async().plan_description())
        return {
            "plan": described["plan"],
            "rows_per_rank": described["load"]["rows"],
            "bytes_per_rank": described["load"]["bytes"],
            "sharding": self.knobs.sharding,
            "kernel": self.knobs.kernel,
            "use_pipeline": self.use_pipeline,
            "pipelined_modules": described["pipelined_modules"],
        }

    def close(self) -> None:
        deployment, self._deployment = self._deployment, None
        if deployment is None:
            return
        try:
            if self._trainers and deployment.failure is None:
                deployment.wait([t.rpc_async().close() for t in self._trainers], timeout_s=60)
        finally:
            self._trainers = []
            deployment.close()

    def _require_setup(self) -> tuple[TrainContext, Deployment]:
        if self._ctx is None or self._deployment is None:
            raise RuntimeError("TorchRecSharding used before setup(ctx) or after close()")
        return self._ctx, self._deployment


def _same_batch(a: Batch, b: Batch) -> bool:
    return torch.equal(a.labels, b.labels) and torch.equal(
        a.sparse_features.values(), b.sparse_features.values()
    )

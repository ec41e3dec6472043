"""The one interface every training system implements (Bagpipe and every baseline).

The runner owns the data order, seeds, the evaluation cadence, timing and logging; a system only
turns batches into updates of its (possibly distributed) embedding tables and dense model. Systems
are plugins found by name through the ``bagpipe.systems`` entry-point group (see ``registry.py``).

A system's life::

    system = load_system("sync_ps")(**knobs)   # or hydra.utils.instantiate(cfg.system)
    system.setup(context)                      # spawn roles, build model replicas, same init as all
    source = system.prepare_dataset(source)    # identity, except FAE which re-packs (and says so)
    for step, batch in enumerate(source):
        result = system.train_step(step, batch)
    state = system.full_state()                # the materialised tables, wherever they live
    system.close()                             # every role it started has ended
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from bagpipe.core.batch import Batch, DatasetSchema
from bagpipe.core.meter import StepRecord
from bagpipe.core.net.wire import NetworkConfig
from bagpipe.core.recovery import Recovery

if TYPE_CHECKING:
    from bagpipe.core.source import BatchSource


@dataclass(frozen=True)
class OptimConfig:
    """Plain SGD for embeddings and dense layers: the semantics every system must reproduce.

    The loss is the mean binary cross-entropy over the *global* batch; gradients from trainers are
    summed, so a T-trainer run takes exactly the step of a single process on the whole batch.
    """

    embedding_lr: float = 0.1
    dense_lr: float = 0.1


@dataclass(frozen=True)
class ModelConfig:
    """Which model, and its architecture. ``name`` is one of ``dlrm``, ``wdl``, ``deepfm``, ``dcn``.

    Sizes of the MLPs are lists of layer widths *after* the input layer (the input width follows from
    the dataset and ``embedding_dim``). Defaults are small, CPU-sized; the paper's architectures are
    given by :func:`paper_config`.
    """

    name: str = "dlrm"
    embedding_dim: int = 16
    # On the dense features: DLRM/DeepFM/DCN's bottom MLP (must end in embedding_dim), W&D's deep
    # tower (any width).
    bottom_mlp: tuple[int, ...] = (64, 16)
    # To the logit (must end in 1): DLRM's top MLP, W&D's head over [embeddings || deep tower],
    # DeepFM's deep MLP over the fields, DCN's over-arch.
    top_mlp: tuple[int, ...] = (64, 32, 1)
    # DCN's low-rank cross net:
    cross_layers: int = 2
    cross_rank: int = 8
    dropout: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def cache_budget_rows(schema: DatasetSchema, fraction: float) -> int:
    """The rows one trainer may cache under a budget of ``fraction`` of the dataset's embedding
    rows: the one budget rule every caching system follows (Bagpipe's capacity, HET's cache
    lines, FAE's hot replica), so equal budgets scale with the tables alike."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"cache budget must be a share of the rows in (0, 1], got {fraction}")
    return max(1, int(fraction * schema.total_rows))


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: ``step`` batches are done and the model is ``state``.

    A system that declares ``supports_resume`` builds its replicas and shards from ``state`` instead
    of the seeded initial weights, and expects ``train_step`` to be called from ``step`` on.
    """

    step: int
    state: ModelState


@dataclass
class TrainContext:
    """Everything a system needs to set itself up; built by the runner, identical for all systems.

    ``resume`` is set only when the runner restarts a run from a checkpoint (``bagpipe.core.checkpoint``).
    Every process reaches its Meter through ``bagpipe.core.runtime.current().meter``, the driver's
    included; the context carries none, so there is one road to it.
    ``num_steps`` is how many steps the run trains (the runner sets it; the batch of step ``i`` is
    ``source[i % len(source)]``); ``None``, for a system driven step by step outside the runner,
    means one pass over ``source``. A system that plans ahead over the data needs it to know where
    the stream ends.
    ``device`` is where the trainers compute, already resolved (``bagpipe.core.device``): ``cpu``
    or ``cuda``. Every system keeps its trainers' state there and its servers' on the host.
    """

    schema: DatasetSchema
    model: ModelConfig
    optim: OptimConfig
    global_batch_size: int
    seed: int
    source: BatchSource
    network: NetworkConfig = field(default_factory=NetworkConfig)
    workdir: Path = field(default_factory=lambda: Path("."))
    resume: ResumePoint | None = None
    num_steps: int | None = None
    device: str = "cpu"

    def trainer_spec(self) -> TrainerSpec:
        """What every trainer of this run is built from (the same for all of them)."""
        return TrainerSpec(
            schema=self.schema,
            model=self.model,
            optim=self.optim,
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            resume=self.resume,
            device=self.device,
        )


@dataclass(frozen=True)
class TrainerSpec:
    """What every trainer of a run is built from: the same for all T of them, in every system.

    Picklable, so a driver sends it to its trainer processes. Systems add their own knobs beside
    it (a cache design, sharding knobs), never by restating these fields.

    Args:
        schema: the dataset's schema.
        model: the model config (its dense part is replicated on every trainer).
        optim: learning rates.
        global_batch_size: what every slice loss is divided by (``bagpipe.training.step``).
        seed: model seed.
        resume: the checkpoint to start from (its step and model), for systems that resume.
        device: where trainers compute (``cpu`` or ``cuda``; ``bagpipe.core.device.trainer_device``
            picks each trainer's GPU).
    """

    schema: DatasetSchema
    model: ModelConfig
    optim: OptimConfig
    global_batch_size: int
    seed: int
    resume: ResumePoint | None = None
    device: str = "cpu"

    @property
    def resume_state(self) -> ModelState | None:
        """The checkpoint's model to start from, or ``None`` for the seeded weights."""
        return self.resume.state if self.resume is not None else None


@dataclass
class StepResult:
    """What one training iteration produced.

    ``record`` is the Meter record of the iteration, merged over the system's roles (bytes and rows
    summed over all roles, phase times as seen by trainer 0).
    """

    loss: float
    record: StepRecord = field(default_factory=StepRecord)


@dataclass
class ModelState:
    """A full, materialised model: every embedding table and the dense part's ``state_dict``."""

    tables: dict[str, torch.Tensor]
    dense: dict[str, torch.Tensor]


@dataclass(frozen=True)
class PhaseInfo:
    """A boundary the runner announces (after an evaluation, at the end of an epoch)."""

    step: int
    kind: str
    eval_logloss: float | None = None


class System(ABC):
    """Base class of every training system.

    Subclasses set ``name`` and take their knobs as constructor keyword arguments, so that
    ``hydra.utils.instantiate(cfg.system)`` builds them from a config node.
    """

    name: ClassVar[str]
    #: True for systems whose ``prepare_dataset`` changes which examples share a batch (FAE).
    reorders_samples: ClassVar[bool] = False
    #: True for systems whose ``setup`` honours ``ctx.resume`` (restart from a checkpoint).
    supports_resume: ClassVar[bool] = False

    @abstractmethod
    def setup(self, ctx: TrainContext) -> None:
        """Start the roles and build every replica from the shared seeded initial state."""

    def reads_ahead(self) -> int:
        """How many batches past the current one ``train_step`` reads from ``ctx.source`` (HET's
        prefetch, TorchRec's pipeline): the runner produces them before the step, as it does the
        step's own batch, so no system generates data inside its timed window."""
        return 0

    def prepare_dataset(self, source: BatchSource) -> BatchSource:
        """Return the batch source to train on; identity unless ``reorders_samples``."""
        return source

    @abstractmethod
    def train_step(self, step: int, batch: Batch) -> StepResult:
        """Train on global batch number ``step`` and return once its update is applied."""

    def on_phase_boundary(self, info: PhaseInfo) -> None:  # noqa: B027 - optional hook
        """React to a runner boundary (FAE's scheduler, HET's flush); nothing by default."""

    @abstractmethod
    def full_state(self) -> ModelState:
        """Materialise every embedding table and the dense model, wherever they live."""

    def stats(self) -> dict[str, Any]:
        """System-specific totals beyond the Meter (plan, hot-set share, staleness...)."""
        return {}

    def state_devices(self) -> dict[str, str]:
        """Where each part of trainer 0's state lives, e.g. ``{"dense": "cuda:0", "cache":
        "cuda:0"}`` (after ``setup``): what the runner records and the device tests assert."""
        return {}

    def recoveries(self) -> list[Recovery]:
        """Role failures this system got past in place (``bagpipe.core.recovery``, path
        ``replace``); none by default: a failure ends the job, which restarts from a checkpoint."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """End every process and thread the system started."""

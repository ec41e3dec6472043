"""Structured-config schemas for the ``suites/`` tree, registered in Hydra's ``ConfigStore``.

Every YAML option of a group extends a ``base_<name>`` schema (STYLE.md §4), so a misspelt key or a
value of the wrong type fails while the config is composed, naming the key, before any job starts.

The schemas of systems, models, datasets, the topology and the optimiser are *derived* from the
classes they configure (a system's ``__init__`` keyword arguments, the ``ModelConfig``,
``DatasetConfig``, ``Topology`` and ``OptimConfig`` dataclass fields) rather than written out a
second time: a knob added to a system is valid in YAML at once, and a knob removed from it makes a
stale YAML fail loudly. A system may instead declare ``config_class``, a
dataclass that is then used as its schema unchanged.

The launcher has no schema on purpose: a structured launcher config breaks with Hydra 1.3 and
hydra-submitit-launcher 1.2.0 (harness.md §2.2).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import types
import typing
import warnings
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from bagpipe.core.interface import OptimConfig
from bagpipe.core.net import BACKENDS, Topology
from bagpipe.core.registry import ENTRY_POINT_GROUP

_SCALARS = (int, float, str, bool)


class Division(enum.StrEnum):
    """MLPerf division; the systems here change training semantics, so results are ``open``."""

    open = "open"
    closed = "closed"


@dataclass
class RunSchema:
    """What the runner does: steps, batch, evaluation cadence and the quality target."""

    steps: int = 200
    batch_size: int = 1024
    eval_every: int = 50
    eval_batches: int = 4
    warmup_steps: int = 5
    target_auc: float = 0.7
    progress: bool = True
    #: Intra-op threads of the driver process. Spawned roles use one thread each; the driver (all
    #: of ``local``'s compute) uses the same, or on a shared machine its OpenMP threads spin
    #: against other processes and its iteration time is not comparable.
    torch_threads: int = 1
    #: Save a checkpoint every this many steps (0: never). The run then restarts from the newest
    #: one after a role failure, and a requeued (preempted) job resumes from it.
    checkpoint_every: int = 0
    #: Where checkpoints go; null: ``<run dir>/checkpoints`` (the same directory when SLURM
    #: requeues the job). A directory that already holds this run's checkpoints is resumed from.
    checkpoint_dir: str | None = None
    #: Role failures a run survives (restarting from the newest checkpoint) before it fails.
    max_restarts: int = 3


@dataclass
class TrackingSchema:
    """MLflow: where runs go, and which system speedups are measured against.

    ``uri`` null means the embedded default ``sqlite:///<launch dir>/mlflow.db``.
    """

    uri: str | None = None
    experiment: str = "bagpipe-harness"
    reference_system: str = "sync_ps"
    enabled: bool = True


@dataclass
class MllogSchema:
    """The MLPerf ``mllog`` file every run writes (``results/<system>-<model>/<benchmark>/``).

    ``results_dir`` null means ``<sweep dir>/results`` in a sweep, ``<run dir>/results`` otherwise.
    """

    benchmark: str = "dlrm_dcnv2"
    division: Division = Division.open
    org: str = "bagpipe-harness"
    platform: str = "cpu-emulated-cluster"
    results_dir: str | None = None


def _omegaconf_type(hint: Any) -> Any:
    """The closest type OmegaConf can validate for a Python annotation (``Any`` when none)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _SCALARS or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return hint
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            converted = _omegaconf_type(inner[0])
            return Any if converted is Any else converted | None
        return Any
    if origin is typing.Literal:
        return str if all(isinstance(a, str) for a in args) else Any
    if origin in (tuple, list, collections.abc.Sequence):
        items = [a for a in args if a is not Ellipsis]
        item = _omegaconf_type(items[0]) if len(set(items)) == 1 else Any
        return list[item]  # type: ignore[valid-type]
    if origin is dict and len(args) == 2 and args[0] is str:
        return dict[str, _omegaconf_type(args[1])]  # type: ignore[misc]
    return Any


def _default_for(value: Any) -> Any:
    """A dataclass field default for ``value`` (lists and dicts need a factory)."""
    if value is inspect.Parameter.empty or value is dataclasses.MISSING:
        return field(default=MISSING)
    if isinstance(value, tuple | list):
        items = list(value)
        return field(default_factory=lambda: list(items))
    if isinstance(value, dict):
        mapping = dict(value)
        return field(default_factory=lambda: dict(mapping))
    if value is None or isinstance(value, (*_SCALARS, enum.Enum)):
        return field(default=value)
    return field(default=MISSING)


def choice_enum(name: str, values: typing.Iterable[str]) -> type[enum.Enum]:
    """An enum of the valid values of a string field: OmegaConf then rejects any other value at
    composition time and lists the valid ones in its error."""
    return enum.Enum(name, {value: value for value in values})  # type: ignore[return-value]


def schema_from_dataclass(
    cls: type, name: str, choices: dict[str, typing.Iterable[str]] | None = None
) -> type:
    """A mutable, OmegaConf-typed copy of dataclass ``cls`` (tuples become lists, nested
    dataclasses nested schemas).

    ``choices`` turns the named string fields into enums of their valid values.
    """
    hints = typing.get_type_hints(cls)
    choices = choices or {}
    fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            nested = schema_from_dataclass(hints[f.name], f"{name}_{f.name}")
            fields.append((f.name, nested, field(default_factory=nested)))
            continue
        default: Any = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        hint = _omegaconf_type(hints[f.name])
        if f.name in choices:
            hint = choice_enum(f"{name}_{f.name}", choices[f.name])
            default = hint[default] if isinstance(default, str) else default
        fields.append((f.name, hint, _default_for(default)))
    return dataclasses.make_dataclass(name, fields)


#: Plain SGD and the described cluster, derived from the dataclasses the job builds from them
#: (``bagpipe.core.interface.OptimConfig``, ``bagpipe.core.net.Topology``): a field added there is
#: valid in YAML at once.
OptimSchema = schema_from_dataclass(OptimConfig, "OptimSchema")
TopologySchema = schema_from_dataclass(Topology, "TopologySchema")


class Backend(enum.StrEnum):
    """The network back-ends a run may ask for (``bagpipe.core.net.BACKENDS`` plus ``auto``)."""

    auto = "auto"
    netns = "netns"
    model = "model"
    real = "real"


assert {b.value for b in Backend} == {"auto", *BACKENDS}, "Backend lists every back-end"


@dataclass
class NetworkSchema:
    """How the network of the topology is emulated (``bagpipe.core.net``).

    ``backend``: ``auto`` (``netns`` as root, else ``model``), ``netns``, ``model`` or ``real``
    (nothing emulated: a real cluster, or a network-off run). ``dilation``: every emulated
    bandwidth divided and every latency multiplied by it; ``auto`` calibrates it once per sweep
    and model from the trainers' compute time here and on the topology's device
    (:mod:`bagpipe.harness.run.dilation`).
    """

    backend: Backend = Backend.auto
    dilation: typing.Union[float, int, str] = 1.0  # noqa: UP007 (OmegaConf reads typing.Union)
    #: Multiplies the dilation (a number or ``auto``'s), to show that measured and projected
    #: times move together when the regime moves (fig7's d/2 and 2d check: suite=fig7_dilation).
    dilation_scale: float = 1.0


@dataclass
class HarnessConfig:
    """The primary config (``suites/config.yaml``)."""

    system: Any = MISSING
    model: Any = MISSING
    dataset: Any = MISSING
    run: RunSchema = field(default_factory=RunSchema)
    #: Typed ``Any`` because the schemas are built at import time (no static class to name); the
    #: default is the structured node, so OmegaConf still checks every key and value under it.
    topology: Any = MISSING
    network: NetworkSchema = field(default_factory=NetworkSchema)
    optim: Any = field(default_factory=OptimSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)
    mllog: MllogSchema = field(default_factory=MllogSchema)
    seed: int = 0
    #: Where trainers compute: ``cpu``, ``cuda`` or ``auto`` (``cuda`` where torch sees a GPU).
    #: Embedding-server shards stay in host memory whatever it says (``bagpipe.core.device``).
    device: str = "auto"
    #: Trainer count that system configs interpolate (``num_trainers: ${trainers}``).
    trainers: int = 2
    #: Every caching system's budget: this share of the dataset's rows per trainer.
    cache_budget: float = 0.2
    suite_name: str = "adhoc"
    scale_name: str = "small"
    launcher_name: str = "local"
    #: Re-raise a failed run inside a sweep (a single run always re-raises).
    fail_fast: bool = False


def schema_from_signature(target: type, name: str) -> type:
    """A dataclass of ``target.__init__``'s keyword arguments plus ``_target_`` naming ``target``."""
    init = vars(target).get("__init__") or target.__init__  # type: ignore[misc]
    hints = typing.get_type_hints(init)
    fields: list[tuple[str, Any, Any]] = [
        ("_target_", str, field(default=f"{target.__module__}.{target.__qualname__}"))
    ]
    for param in inspect.signature(init).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        fields.append(
            (param.name, _omegaconf_type(hints.get(param.name, Any)), _default_for(param.default))
        )
    return dataclasses.make_dataclass(name, fields)


def system_schema(system_cls: type) -> type:
    """The schema of one system: its ``config_class`` if it declares one, else its signature."""
    declared = getattr(system_cls, "config_class", None)
    if declared is not None:
        return declared
    return schema_from_signature(system_cls, f"{system_cls.__name__}Schema")


def _paper_arch(key: str, *, _root_: Any) -> Any:
    """Resolver ``${paper_arch:<field>}``: the paper's value of ``<field>`` for the chosen model.

    The paper's architectures live once, in :func:`bagpipe.models.paper_config`; the ``scale=paper``
    option reads them through this resolver so the resolved config shows the real widths.
    """
    from bagpipe.models import paper_config

    name = _root_.model.name
    value = getattr(paper_config(name.value if isinstance(name, enum.Enum) else str(name)), key)
    return list(value) if isinstance(value, tuple) else value


def register_configs() -> None:
    """Register every schema (idempotent): the primary config, systems, model and dataset."""
    from bagpipe.data import KINDS, PRESETS, DatasetConfig
    from bagpipe.models import MODELS, ModelConfig

    if not OmegaConf.has_resolver("paper_arch"):
        OmegaConf.register_new_resolver("paper_arch", _paper_arch)
    store = ConfigStore.instance()
    store.store(name="base_harness", node=HarnessConfig)
    model = schema_from_dataclass(ModelConfig, "ModelSchema", {"name": MODELS})
    dataset = schema_from_dataclass(
        DatasetConfig, "DatasetSchema", {"kind": KINDS, "preset": PRESETS}
    )
    store.store(group="model", name="base_model", node=model)
    store.store(group="topology", name="base_topology", node=TopologySchema)
    store.store(group="dataset", name="base_dataset", node=dataset)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            system_cls = ep.load()
        except Exception as err:  # one broken plugin must not take the others down
            warnings.warn(f"system {ep.name!r} ({ep.value}) failed to import: {err!r}", stacklevel=2)
            continue
        store.store(group="system", name=f"base_{ep.name}", node=system_schema(system_cls))

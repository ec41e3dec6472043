"""What a job builds from its config, and the check that builds it once while the config is composed.

A run turns its config into the dataset, model, optimiser and network configs, the training loop's
:class:`RunConfig` and the system object, each of which refuses a value it cannot use (a negative
lookahead, a cleanup fraction the oracle cannot plan with, zero steps). The schemas catch a
misspelt key or a wrong type while Hydra composes; :func:`check_job` catches the rest at the same
moment by building those objects once: a system's constructor only checks and keeps its knobs
(its ``setup`` starts the processes), so building one starts nothing. A single run is checked
before it starts (:class:`~bagpipe.harness.run.callbacks.ConfigCheck`), a sweep checks every job
before the first is launched (:func:`~bagpipe.harness.run.sweep.validate_sweep`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:
    from bagpipe.core.interface import OptimConfig, System
    from bagpipe.core.net import NetworkConfig
    from bagpipe.data import DatasetConfig
    from bagpipe.harness.run.runner import RunConfig
    from bagpipe.models import ModelConfig


class JobConfigError(ValueError):
    """A config value the job's objects refuse; the message names the config node."""


@dataclass(frozen=True)
class JobParts:
    """The plain objects a job's config stands for (nothing started, no data read)."""

    dataset: DatasetConfig
    model: ModelConfig
    optim: OptimConfig
    network: NetworkConfig
    run: RunConfig


def build_parts(cfg: DictConfig) -> JobParts:
    """The dataset, model, optimiser, network and loop configs of ``cfg``."""
    return JobParts(_dataset(cfg), _model(cfg), _optim(cfg), network_config(cfg), _loop(cfg))


def build_system(cfg: DictConfig) -> System:
    """The system ``cfg.system`` configures (constructed, not set up)."""
    from hydra.utils import instantiate

    return instantiate(cfg.system, _convert_="all")  # type: ignore[no-any-return]


def check_job(cfg: DictConfig) -> None:
    """Build every part of the job once; raise :class:`JobConfigError` naming the node that
    refused its value, with the refusal's first line."""
    from hydra.errors import InstantiationException

    builders: dict[str, Callable[[DictConfig], object]] = {
        "run": _loop, "dataset": _dataset, "model": _model, "optim": _optim,
        "network": network_config, "system": build_system,
    }
    for node, build in builders.items():
        try:
            build(cfg)
        except InstantiationException as err:  # the constructor's own error says it best
            raise JobConfigError(f"{node}: {first_line(err.__cause__ or err)}") from err
        except (ValueError, TypeError) as err:
            raise JobConfigError(f"{node}: {first_line(err)}") from err


def _dataset(cfg: DictConfig) -> DatasetConfig:
    from bagpipe.data import DatasetConfig

    return DatasetConfig(**plain(cfg.dataset))


def _model(cfg: DictConfig) -> ModelConfig:
    from bagpipe.models import ModelConfig

    return ModelConfig(**_tupled(plain(cfg.model)))


def _optim(cfg: DictConfig) -> OptimConfig:
    from bagpipe.core.interface import OptimConfig

    return OptimConfig(**plain(cfg.optim))


def network_config(cfg: DictConfig) -> NetworkConfig:
    """The run's network: the chosen topology with the run's trainer count, its back-end (``auto``
    resolved for this machine) and a fixed dilation. ``dilation: auto`` needs the dataset's schema
    and a measurement, so the job resolves it (:func:`bagpipe.harness.run.dilation.calibrated`)
    and replaces the factor 1 left here."""
    from bagpipe.core.net import NetworkConfig, Topology, resolve_backend
    from bagpipe.harness.run.dilation import parse_dilation

    topology = Topology.from_dict(plain(cfg.topology)).with_counts(trainers=int(cfg.trainers))
    backend = cfg.network.backend
    name = backend.value if hasattr(backend, "value") else str(backend)
    factor = parse_dilation(cfg.network.dilation)
    return NetworkConfig(resolve_backend(name), topology, 1.0 if factor is None else factor)


def _loop(cfg: DictConfig) -> RunConfig:
    from bagpipe.harness.run.runner import RunConfig

    run = cfg.run
    return RunConfig(num_steps=int(run.steps), eval_every=int(run.eval_every),
                     warmup_steps=int(run.warmup_steps), progress=bool(run.progress),
                     checkpoint_every=int(run.checkpoint_every),
                     torch_threads=int(run.torch_threads))


def plain(node: DictConfig) -> dict[str, Any]:
    """A config node as a resolved dict, without Hydra's ``_target_``-style keys."""
    container = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items() if not str(k).startswith("_")}


def _tupled(values: dict[str, Any]) -> dict[str, Any]:
    """Lists back to tuples: the frozen config dataclasses hold tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name when it has none): what is printed
    of a refusal or a failure, the rest being kept in a record or a traceback."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__

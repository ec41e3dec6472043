"""Cost model: per-iteration time of each system from its exact byte counts and its overlap rules.

A run measures, per iteration, the bytes every trainer moved on each kind of link (the Meter's
columns: ``emb_pull``, ``emb_push``, ``allreduce``, ``alltoall``, ``h2d``, HET's ``emb_meta``) and
the time the iteration took. The model re-prices those bytes on any network and puts them where the
system puts them:

* **critical path**: ``compute + sum(time of the critical flows)``, where ``compute`` is everything
  that is not emulated wire time (the iteration time measured with the link model off, a run's
  trainer CPU per iteration, or a GPU's compute time for a projection);
* **background lanes** (Bagpipe's prefetch/write-back rounds and its sync-later all-reduce, HET's
  communication thread): work that overlaps the critical path but that the next iterations wait
  for when it falls behind. A lane holds the iteration to at least its own time plus the time of
  the critical flows that use the same links (they queue behind each other on those links).

So ``iteration = max(critical path, every lane's bound)``: a pipeline's steady state. Which flow is
on which lane is data (:data:`SYSTEM_RULES`), written from each system's trainer code; the numbers
come only from the Meter and the described cluster (:class:`Topology`, ``suites/topology/*.yaml``).

The servers' own CPU (:attr:`Workload.server_cpu_s`: serving pulls, applying pushes, the oracle's
planning) is charged where the traffic it answers waits: on the lane of the system's embedding-pull
flow (:func:`server_lane`), so the same overlap rules that place the bytes place it, with no rule
of its own per system. That is the critical path for a system that waits for its pulls (sync_ps,
FAE), a background lane for one that prefetches (HET's communication thread, Bagpipe's rounds),
and nowhere for one without servers (TorchRec). It stays 0 where ``compute`` already holds it (an
iteration time measured with the link off has the servers' replies in it).

Timing follows the emulated network (``bagpipe.core.net``): a message costs its sender NIC's
latency plus its bytes at the NIC's rate; an all-reduce is a ring (``2 (T-1)`` messages of
``bytes / T``). NICs are shared: a trainer's sends to all shards share its NIC, and a server's NIC
carries what all T trainers send it or ask of it.

Example::

    topology = Topology.load("suites/topology/paper.yaml")
    prediction = predict(workload, topology)     # Prediction.iter_s, .critical_s, .lanes_s
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bagpipe.core.net.topology import BITS_PER_BYTE, Nic, Topology

CRITICAL = "critical"
#: The Meter column of the flow that asks the embedding servers for rows: the servers' work is
#: charged on its lane (:func:`server_lane`).
SERVER_REQUEST_KIND = "emb_pull"


class Pattern(StrEnum):
    """How one flow's bytes cross the network, seen from one trainer."""

    SHARDS = "shards"  # to/from all S server shards at once (one link each), bytes spread evenly
    SHARDS_SERIAL = "shards_serial"  # to the S shards one after another (a loop of sends)
    RING = "ring"  # ring all-reduce among the T trainers
    PEERS = "peers"  # all-to-all: to the T-1 other trainers at once, receiving meanwhile
    # gloo's all-to-all: to each peer, then from it (its sends and receives do not overlap;
    # measured on the netns back-end, see bagpipe.core.collectives): twice PEERS' wire time
    PEERS_SERIAL = "peers_serial"


@dataclass(frozen=True)
class Flow:
    """One stream of a system's traffic, as the trainer code moves it.

    Args:
        kind: the Meter column its bytes are counted in.
        pattern: how the bytes cross the network (:class:`Pattern`).
        lane: ``"critical"`` or the name of the background lane it runs on.
        messages: latencies it pays per iteration (per shard or per ring step: one
            request-reply pull is 2; a ring all-reduce is counted by the ring formula, give 1).
        rows_counter: this flow is the part of ``kind`` given by a per-iteration counter of rows
            (``row_bytes`` each); a flow of the same kind without a counter gets the rest of the
            kind's bytes (e.g. the ids sent with requests).
        counter_sums_trainers: ``False``: the counter counts the global batch's rows once and
            every trainer moves all of them (Bagpipe's ``rows_sync_later``); ``True``: it sums
            the rows every trainer moved (the Meter's ``rows_<kind>``), so one trainer moves a
            ``1/T`` share.
        every: the flow happens once every ``every`` iterations (its latencies are spread over
            them; its bytes already are, being per-iteration means).
    """

    kind: str
    pattern: Pattern
    lane: str = CRITICAL
    messages: float = 1.0
    rows_counter: str | None = None
    counter_sums_trainers: bool = False
    every: str | int = 1


@dataclass(frozen=True)
class SystemRule:
    """Where a system's flows sit. ``lanes`` lists the background lanes (flows name them)."""

    flows: tuple[Flow, ...]

    @property
    def lanes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.lane for f in self.flows if f.lane != CRITICAL))


_P = Pattern
#: Each system's overlap rules, read from its trainer code (module docstrings cite the steps).
SYSTEM_RULES: dict[str, SystemRule] = {
    # Every table in one process: no network at all.
    "local": SystemRule(flows=()),
    # bagpipe/training/embedding_free.py: every row on every trainer, only the dense all-reduce.
    "embedding_free": SystemRule(flows=(Flow("allreduce", _P.RING),)),
    # baselines/sync_ps/trainer.py: pull (request + reply, shards in parallel), compute, push
    # (shards in parallel), dense all-reduce, wait acks -- all on the critical path.
    "sync_ps": SystemRule(
        flows=(
            Flow("emb_pull", _P.SHARDS, messages=2),
            Flow("emb_push", _P.SHARDS, messages=1),
            Flow("allreduce", _P.RING),
        )
    ),
    # bagpipe/trainer.py: all-reduce(sync_now ++ dense) on the critical path; all-reduce(sync_later)
    # started after the step, on the same ring, waited at the next step; prefetch and write-back
    # in the background rounds thread, shards in parallel (write back, then request + reply),
    # once every cleanup interval.
    "bagpipe": SystemRule(
        flows=(
            Flow("allreduce", _P.RING),
            Flow("allreduce", _P.RING, lane="sync_later", rows_counter="rows_sync_later"),
            Flow("emb_pull", _P.SHARDS, lane="rounds", messages=2, every="cleanup_interval"),
            Flow("emb_push", _P.SHARDS, lane="rounds", messages=1, every="cleanup_interval"),
        )
    ),
    # baselines/het/roles.py (asp, prefetch): one communication thread pulls for step i+1 and
    # pushes step i's deltas while step i computes; the dense all-reduce is critical. Requests,
    # keys and pushes go to the shards one after another.
    "het": SystemRule(
        flows=(
            Flow("allreduce", _P.RING),
            Flow("emb_meta", _P.SHARDS_SERIAL, lane="comm", messages=3),
            Flow("emb_pull", _P.SHARDS, lane="comm", messages=1),
            Flow("emb_push", _P.SHARDS_SERIAL, lane="comm", messages=1),
        )
    ),
    # baselines/fae/roles.py + system.py, all on the critical path (the driver waits for a swap
    # before the step); every transfer goes through the shared client, shards in parallel, as in
    # sync_ps. Cold step: pull (request + reply), forward/backward, dense all-reduce, push. Hot
    # step: one all-reduce of the dense gradients and the whole replica's gradient. Swaps (h2d):
    # cold -> hot, every trainer pulls the hot rows; hot -> cold, trainer 0 alone writes them back.
    # The Meter's h2d column holds both directions, spread over the trainers, so the rule prices
    # ``(T+1) H`` row transfers per swap pair (H hot rows) over T trainers where the slowest
    # trainer (0) moves ``2 H``: it underprices swaps by up to ``2T / (T+1)`` (4/3 at T = 2).
    # Swap latencies are charged every step (their bytes are means over the window), which
    # matters only at high bandwidth.
    "fae": SystemRule(
        flows=(
            Flow("emb_pull", _P.SHARDS, messages=2),
            Flow("emb_push", _P.SHARDS, messages=1),
            Flow("allreduce", _P.RING),
            Flow("h2d", _P.SHARDS, messages=3),
        )
    ),
    # baselines/torchrec_sharding/trainer.py: per sharding type of the plan three all-to-all
    # rounds (ids in, pooled embeddings out, their gradients back), each as long as its largest
    # chunk (peers in parallel; on gloo, as the harness runs it, sends before receives), then the
    # dense all-reduce; all block the step. ``messages`` is for one sharding type (a plan that
    # mixes k types pays 3k latencies).
    "torchrec": SystemRule(
        flows=(
            Flow("alltoall", _P.PEERS_SERIAL, messages=3),
            Flow("allreduce", _P.RING),
        )
    ),
}


@dataclass(frozen=True)
class Workload:
    """What one system moves and computes per iteration (means over a run's measured window).

    Args:
        system: a key of :data:`SYSTEM_RULES`.
        bytes_per_iter: Meter column -> bytes per iteration, summed over the trainers.
        counters: per-iteration counters (``rows_sync_later`` ...).
        compute_s: one trainer's iteration without emulated wire time (the iteration time
            measured with the link off, or a run's trainer CPU per iteration).
        trainers / servers: ``T`` and ``S`` of the run.
        row_bytes: bytes of one embedding row (``table_dim * 4``).
        dense_params: parameters of the dense model (for a projection's compute time).
        batch_size: global batch of the run.
        knobs: system settings a rule refers to (``cleanup_interval``).
        server_cpu_s: CPU seconds per iteration of the roles that answer the trainers (servers,
            the oracle), all of them together; charged on the lane of the system's pull flow
            (:func:`server_lane`). 0 (the default) where ``compute_s`` already holds their work.
    """

    system: str
    bytes_per_iter: Mapping[str, float]
    counters: Mapping[str, float]
    compute_s: float
    trainers: int
    servers: int
    row_bytes: int
    dense_params: int = 0
    batch_size: int = 0
    knobs: Mapping[str, float] = field(default_factory=dict)
    server_cpu_s: float = 0.0

    @classmethod
    def from_steps(cls, system: str, steps: Sequence[Mapping[str, float]], compute_s: float,
                   **kwargs: Any) -> Workload:
        """Means of the per-step metrics of a run (``RunResult.steps`` past its warm-up)."""
        if not steps:
            raise ValueError(f"{system}: no measured steps to build a workload from")
        keys = {k for step in steps for k in step}
        mean = {k: math.fsum(step.get(k, 0.0) for step in steps) / len(steps) for k in keys}
        return cls(
            system=system,
            bytes_per_iter={k[len("bytes_"):]: v for k, v in mean.items() if k.startswith("bytes_")},
            counters={k: v for k, v in mean.items() if k.startswith("rows_")},
            compute_s=compute_s,
            **kwargs,
        )


@dataclass(frozen=True)
class Prediction:
    """A predicted iteration: its time, the critical path, each lane's bound, each flow's time."""

    iter_s: float
    compute_s: float
    critical_s: float
    lanes_s: dict[str, float]
    flows_s: dict[str, float]

    @property
    def network_share(self) -> float:
        return 1.0 - self.compute_s / self.iter_s if self.iter_s > 0 else 0.0


def flow_bytes(rule: SystemRule, workload: Workload) -> list[float]:
    """Bytes per iteration *per trainer* of each flow of ``rule``."""
    trainers = workload.trainers
    counted: dict[str, float] = {}
    out: list[float] = []
    for flow in rule.flows:
        if flow.rows_counter is not None:
            rows_bytes = workload.counters.get(flow.rows_counter, 0.0) * workload.row_bytes
            if flow.counter_sums_trainers:
                per_trainer, all_trainers = rows_bytes / trainers, rows_bytes
            else:  # every trainer moves the whole list of rows
                per_trainer, all_trainers = rows_bytes, rows_bytes * trainers
            counted[flow.kind] = counted.get(flow.kind, 0.0) + all_trainers
            out.append(per_trainer)
        else:
            out.append(math.nan)
    for index, flow in enumerate(rule.flows):
        if flow.rows_counter is None:
            total = workload.bytes_per_iter.get(flow.kind, 0.0) - counted.get(flow.kind, 0.0)
            out[index] = max(total, 0.0) / trainers
    return out


def flow_time_s(flow: Flow, per_trainer_bytes: float, topology: Topology, every: float) -> float:
    """Seconds one trainer spends on ``flow`` per iteration on ``topology``."""
    if per_trainer_bytes <= 0:
        return 0.0
    lat_s = topology.trainer_nic.latency_s
    bits = per_trainer_bytes * BITS_PER_BYTE
    t, s = topology.trainers, topology.servers
    trainer_bps = _payload_bits_per_s(topology.trainer_nic)
    server_bps = _payload_bits_per_s(topology.server_nic)
    messages = flow.messages / every
    if flow.pattern is Pattern.RING:
        if t <= 1:
            return 0.0
        steps = 2 * (t - 1)
        return steps * lat_s / every + steps * bits / t / trainer_bps
    if flow.pattern in (Pattern.PEERS, Pattern.PEERS_SERIAL):
        if t <= 1:
            return 0.0
        directions = 2 if flow.pattern is Pattern.PEERS_SERIAL else 1
        return messages * lat_s + directions * bits / trainer_bps
    # The trainer's NIC carries all its bytes; each server's NIC carries 1/S of every trainer's.
    serial = s if flow.pattern is Pattern.SHARDS_SERIAL else 1
    return serial * messages * lat_s + max(bits / trainer_bps, t * bits / s / server_bps)


def _payload_bits_per_s(nic: Nic) -> float:
    """The payload rate of a NIC's slower direction (the emulation's rule: ``Nic``)."""
    return min(nic.egress_payload_bytes_per_s, nic.ingress_payload_bytes_per_s) * BITS_PER_BYTE


def compute_time_s(workload: Workload, topology: Topology) -> float:
    """The topology's compute time for one iteration: its device's FLOP estimate, or measured."""
    batch = topology.batch_size or workload.batch_size
    estimate = topology.compute.step_time_s(workload.dense_params, batch // topology.trainers)
    return workload.compute_s if estimate is None else estimate


def server_lane(rule: SystemRule) -> str | None:
    """The lane of the flow that asks the servers (:data:`SERVER_REQUEST_KIND`): where their work
    answering it waits. ``None`` for a system that asks no server."""
    return next((f.lane for f in rule.flows if f.kind == SERVER_REQUEST_KIND), None)


def predict(workload: Workload, topology: Topology, rule: SystemRule | None = None) -> Prediction:
    """The iteration time of ``workload`` on ``topology`` under its system's overlap rules, with
    the servers' CPU (:attr:`Workload.server_cpu_s`) on the lane of the pull flow they answer."""
    if rule is None:
        if workload.system not in SYSTEM_RULES:
            raise KeyError(
                f"no cost-model rule for system {workload.system!r}; known: {sorted(SYSTEM_RULES)}"
            )
        rule = SYSTEM_RULES[workload.system]
    times: list[float] = []
    for flow, per_trainer in zip(rule.flows, flow_bytes(rule, workload), strict=True):
        every = flow.every if isinstance(flow.every, int) else workload.knobs.get(flow.every, 1)
        times.append(flow_time_s(flow, per_trainer, topology, max(float(every), 1.0)))
    compute_s = compute_time_s(workload, topology)
    serving = server_lane(rule)

    def served(lane: str) -> float:
        return workload.server_cpu_s if lane == serving else 0.0

    critical_s = compute_s + served(CRITICAL) + sum(
        t for f, t in zip(rule.flows, times, strict=True) if f.lane == CRITICAL
    )
    lanes_s: dict[str, float] = {}
    for lane in rule.lanes:
        # Every flow of a trainer crosses its one NIC: the lane's transfers queue with every other
        # flow on it, the critical path's and the other lanes'. The servers' work is not on the NIC:
        # only the lane that waits for their replies holds it.
        lanes_s[lane] = sum(times) + served(lane)
    labels = [f"{f.kind}{f'[{f.rows_counter}]' if f.rows_counter else ''}:{f.lane}"
              for f in rule.flows]
    return Prediction(
        iter_s=max([critical_s, *lanes_s.values()]),
        compute_s=compute_s,
        critical_s=critical_s,
        lanes_s=lanes_s,
        flows_s=dict(zip(labels, times, strict=True)),
    )


"""embedding_free: sync_ps's trainers with every table local, only the dense part on the wire."""

from __future__ import annotations

import math

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState, StepResult, System, TrainContext
from bagpipe.core.meter import LinkKind
from bagpipe.core.net import NetworkConfig, Topology
from bagpipe.core.registry import load_system
from bagpipe.models import build_dense_model, initial_tables, table_dim
from bagpipe.training.embedding_free import EmbeddingFree
from bagpipe.training.local import LocalSystem
from tests.conftest import assert_states_close, equivalence_context

SCHEMA = DatasetSchema(
    name="emb-free", num_dense=3, table_sizes=(30, 200, 8), feature_names=("a", "b", "c")
)
STEPS, BATCH = 6, 16
#: Every kind of embedding traffic some system moves; this one must move none of them.
EMBEDDING_KINDS = {str(k) for k in (LinkKind.EMB_PULL, LinkKind.EMB_PUSH, LinkKind.EMB_META,
                                    LinkKind.ALLTOALL)}


def _context(**extra: object) -> TrainContext:
    return equivalence_context(SCHEMA, "dlrm", BATCH, STEPS, seed=3, **extra)


def _train(system: System, ctx: TrainContext) -> tuple[list[StepResult], ModelState]:
    """Every step's result and the state after the last one; the system closed after."""
    system.setup(ctx)
    try:
        results = [system.train_step(step, ctx.source[step]) for step in range(STEPS)]
        return results, system.full_state()
    finally:
        system.close()


def test_registered_under_its_name() -> None:
    assert load_system("embedding_free") is EmbeddingFree


def test_two_trainers_on_the_emulated_network_move_only_the_dense_all_reduce() -> None:
    ctx = _context(network=NetworkConfig("model", Topology.uniform(100.0)))
    results, got = _train(EmbeddingFree(num_trainers=2), ctx)
    assert all(math.isfinite(r.loss) for r in results)
    dense_params = sum(p.numel() for p in build_dense_model(ctx.model, SCHEMA, 0).parameters())
    start = initial_tables(SCHEMA, table_dim(ctx.model), ctx.seed)
    for result in results:
        sent = result.record.bytes_sent
        assert not EMBEDDING_KINDS & {kind for kind, nbytes in sent.items() if nbytes}
        assert sent[str(LinkKind.ALLREDUCE)] == 2 * dense_params * 4  # as sync_ps's trainers
        assert set(result.record.phase_s) >= {"fetch_wait", "forward", "backward", "sync",
                                              "optimizer"}
    assert not torch.allclose(got.tables["t_b"], start["t_b"])  # trainer 0's rows were trained


def test_one_trainer_trains_exactly_the_local_model() -> None:
    """One trainer holding every table with plain SGD is the in-process reference's math."""
    want_results, want = _train(LocalSystem(), _context())
    results, got = _train(EmbeddingFree(num_trainers=1), _context())
    torch.testing.assert_close([r.loss for r in results], [r.loss for r in want_results],
                               rtol=0, atol=1e-6)
    assert_states_close(got, want, rtol=0, atol=1e-6)


def test_two_trainers_do_not_train_the_exact_model() -> None:
    """The bound is not exact: a trainer never sees its peer's row gradients (module docstring)."""
    _, want = _train(LocalSystem(), _context())
    _, got = _train(EmbeddingFree(num_trainers=2), _context())
    assert not torch.allclose(got.tables["t_b"], want.tables["t_b"], atol=1e-4)

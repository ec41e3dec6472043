"""The torchrec stand-ins (``bagpipe.core.torchrec_subset``, used where torchrec does not import)
against torchrec itself: same layout, same numbers, same parameter names and, from one seed, the
same weights, so a model trained on a bare GPU machine is the model trained here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchrec.models.dlrm import InteractionArch
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from bagpipe.core import torchrec_subset as subset
from bagpipe.models import build_dense_model
from tests.conftest import TINY_MODEL, TINY_SCHEMA


def test_the_one_hot_kjt_has_torchrec_s_layout() -> None:
    keys, values = ["a", "b"], torch.tensor([1, 2, 3, 7, 8, 9])
    lengths = torch.ones(6, dtype=torch.int32)
    want = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    got = subset.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    assert got.keys() == want.keys() and got.stride() == want.stride()
    for name in ("values", "lengths", "offsets"):
        assert torch.equal(getattr(got, name)(), getattr(want, name)()), name
    with pytest.raises(ValueError, match="do not split over 2 keys"):
        subset.KeyedJaggedTensor(keys, values, torch.ones(5, dtype=torch.int32))


def test_interaction_matches_torchrec_forward_and_backward() -> None:
    dense = torch.randn(5, 4, requires_grad=True)
    sparse = torch.randn(5, 3, 4, requires_grad=True)
    want = InteractionArch(num_sparse_features=3)(dense, sparse)
    want_grads = torch.autograd.grad(want.square().sum(), (dense, sparse))
    got = subset.InteractionArch(num_sparse_features=3)(dense, sparse)
    got_grads = torch.autograd.grad(got.square().sum(), (dense, sparse))
    assert torch.equal(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.equal(g, w)


def test_cross_net_draws_the_same_weights_and_computes_the_same() -> None:
    torch.manual_seed(3)
    want = LowRankCrossNet(in_features=12, num_layers=3, low_rank=2)
    torch.manual_seed(3)
    got = subset.LowRankCrossNet(in_features=12, num_layers=3, low_rank=2)
    want_state, got_state = want.state_dict(), got.state_dict()
    assert list(got_state) == list(want_state)
    for key in want_state:
        assert torch.equal(got_state[key], want_state[key]), key
    x = torch.randn(6, 12)
    assert torch.equal(got(x), want(x))


@pytest.mark.parametrize("name", ["dlrm", "dcn"])
def test_a_model_built_on_the_stand_ins_is_torchrec_s_model(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same seed, same ``state_dict`` and logits, whichever classes the model was built from."""
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    want = build_dense_model(cfg, TINY_SCHEMA, seed=4)
    module = __import__(f"bagpipe.models.{name}", fromlist=["_"])
    for piece in ("InteractionArch", "LowRankCrossNet"):
        if hasattr(module, piece):
            monkeypatch.setattr(module, piece, getattr(subset, piece))
    got = build_dense_model(cfg, TINY_SCHEMA, seed=4)
    assert type(got).__module__ == type(want).__module__
    assert {k: v.shape for k, v in got.state_dict().items()} == {
        k: v.shape for k, v in want.state_dict().items()
    }
    for key, value in want.state_dict().items():
        assert torch.equal(got.state_dict()[key], value), key
    dense = torch.randn(4, TINY_SCHEMA.num_dense)
    pooled = torch.randn(4, TINY_SCHEMA.num_tables, cfg.embedding_dim)
    assert torch.equal(got(dense, pooled), want(dense, pooled))

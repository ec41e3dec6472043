"""The four dense parts on hand-checked tiny cases, plus shapes, config checks and paper configs."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch import nn

from bagpipe.core.batch import DatasetSchema
from bagpipe.models import MODELS, ModelConfig, build_dense_model, paper_config, table_dim
from tests.conftest import TINY_MODEL, TINY_SCHEMA

SMALL = DatasetSchema(name="small", num_dense=2, table_sizes=(3, 3), feature_names=("a", "b"))


def _set(linear: nn.Module, weight: list[list[float]], bias: list[float]) -> None:
    assert isinstance(linear, nn.Linear)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(weight))
        linear.bias.copy_(torch.tensor(bias))


def _inputs(batch: int = 2, dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.rand(batch, 2, generator=gen), torch.randn(batch, 2, dim, generator=gen)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_shape_for_every_model(name: str) -> None:
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    model = build_dense_model(cfg, TINY_SCHEMA, seed=0)
    pooled = torch.randn(5, TINY_SCHEMA.num_tables, table_dim(cfg))
    logits = model(torch.randn(5, TINY_SCHEMA.num_dense), pooled)
    assert logits.shape == (5,)
    assert torch.isfinite(logits).all()


def test_dlrm_matches_manual_dot_interaction() -> None:
    cfg = ModelConfig(name="dlrm", embedding_dim=2, bottom_mlp=(2,), top_mlp=(1,))
    model = build_dense_model(cfg, SMALL, seed=0)
    _set(model.bottom[0], [[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0])  # x = relu(dense) = dense
    top_w = [0.5, -1.0, 2.0, 3.0, -0.25]  # over [x_0, x_1, <x,e_a>, <x,e_b>, <e_a,e_b>]
    _set(model.top[0], [top_w], [0.1])
    dense, pooled = _inputs()
    for i in range(2):
        x, ea, eb = dense[i], pooled[i, 0], pooled[i, 1]
        features = [x[0], x[1], x @ ea, x @ eb, ea @ eb]
        want = sum(w * float(f) for w, f in zip(top_w, features, strict=True)) + 0.1
        assert float(model(dense, pooled).detach()[i]) == pytest.approx(want, abs=1e-5)


def test_wide_deep_matches_manual_and_flattens_per_sample() -> None:
    cfg = ModelConfig(name="wdl", embedding_dim=2, bottom_mlp=(1,), top_mlp=(1,))
    model = build_dense_model(cfg, SMALL, seed=0)
    _set(model.deep[0], [[2.0, -1.0]], [0.5])  # deep = 2 d0 - d1 + 0.5, no activation at the end
    head_w = [1.0, 2.0, 3.0, 4.0, -1.0]  # over [e_a0, e_a1, e_b0, e_b1, deep]
    _set(model.head[0], [head_w], [0.0])
    dense, pooled = _inputs()
    logits = model(dense, pooled).detach()
    for i in range(2):
        deep = 2 * dense[i, 0] - dense[i, 1] + 0.5
        features = [*pooled[i, 0].tolist(), *pooled[i, 1].tolist(), float(deep)]
        want = sum(w * f for w, f in zip(head_w, features, strict=True))
        assert float(logits[i]) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_samples_are_independent(name: str) -> None:
    """Changing sample 1 must not change sample 0's logit (the original W&D broke this)."""
    cfg = dataclasses.replace(TINY_MODEL, name=name)
    model = build_dense_model(cfg, TINY_SCHEMA, seed=1)
    dense = torch.randn(3, TINY_SCHEMA.num_dense)
    pooled = torch.randn(3, TINY_SCHEMA.num_tables, table_dim(cfg))
    before = model(dense, pooled)
    dense2, pooled2 = dense.clone(), pooled.clone()
    dense2[1] += 5.0
    pooled2[1] += 5.0
    after = model(dense2, pooled2)
    assert torch.equal(before[0], after[0]) and torch.equal(before[2], after[2])
    assert not torch.equal(before[1], after[1])


def test_deepfm_matches_manual_fm_and_first_order() -> None:
    """No first-order term over the raw dense features: they enter through their field."""
    cfg = ModelConfig(name="deepfm", embedding_dim=2, bottom_mlp=(2,), top_mlp=(1,))
    assert table_dim(cfg) == 3
    model = build_dense_model(cfg, SMALL, seed=0)
    _set(model.bottom[0], [[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0])  # dense field = relu(dense)
    _set(model.deep[0], [[0.0] * 6], [0.0])  # deep term off: checked separately below
    dense, pooled = _inputs(dim=3)
    logits = model(dense, pooled).detach()
    for i in range(2):
        fields = [dense[i], pooled[i, 0, :2], pooled[i, 1, :2]]
        fm = sum(float(u @ v) for u, v in itertools.combinations(fields, 2))
        first = float(pooled[i, 0, 2] + pooled[i, 1, 2])
        assert float(logits[i]) == pytest.approx(fm + first, abs=1e-5)
    deep_w = [1.0, 0.0, 0.0, 2.0, 0.0, -1.0]  # over the flattened fields
    _set(model.deep[0], [deep_w], [0.5])
    with_deep = model(dense, pooled)
    flat = torch.cat((dense, pooled[:, 0, :2], pooled[:, 1, :2]), dim=1)
    assert torch.allclose(with_deep - logits, flat @ torch.tensor(deep_w) + 0.5, atol=1e-5)


def test_dcn_matches_manual_cross_layers() -> None:
    cfg = ModelConfig(
        name="dcn", embedding_dim=2, bottom_mlp=(2,), top_mlp=(1,), cross_layers=2, cross_rank=1
    )
    model = build_dense_model(cfg, SMALL, seed=3)
    _set(model.bottom[0], [[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0])
    dense, pooled = _inputs()
    x0 = torch.cat((dense, pooled.flatten(1)), dim=1)
    x = x0
    for layer in range(2):
        w, v, b = (
            model.cross.W_kernels[layer],
            model.cross.V_kernels[layer],
            model.cross.bias[layer],
        )
        x = x0 * (x @ v.t() @ w.t() + b) + x
    over = model.over[0]
    want = (x @ over.weight.t() + over.bias).squeeze(-1)
    assert torch.allclose(model(dense, pooled), want, atol=1e-5)


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"model\.bottom_mlp"):
        build_dense_model(ModelConfig(name="dlrm", embedding_dim=4, bottom_mlp=(8, 3)), SMALL, 0)
    with pytest.raises(ValueError, match=r"model\.top_mlp"):
        build_dense_model(ModelConfig(name="dcn", embedding_dim=16, top_mlp=(8, 2)), SMALL, 0)
    with pytest.raises(ValueError, match=r"model\.name"):
        build_dense_model(ModelConfig(name="fgcnn"), SMALL, 0)


KAGGLE_LIKE = DatasetSchema(
    name="kaggle_like",
    num_dense=13,
    table_sizes=(4,) * 26,
    feature_names=tuple(f"cat_{i}" for i in range(26)),
)


@pytest.mark.parametrize(
    ("name", "first_top_in"),
    [("dlrm", 48 + 27 * 26 // 2), ("wdl", 26 * 48 + 256), ("deepfm", 27 * 48), ("dcn", 27 * 48)],
)
def test_paper_configs_build_with_the_papers_widths(name: str, first_top_in: int) -> None:
    cfg = paper_config(name)
    assert cfg.embedding_dim == 48
    model = build_dense_model(cfg, KAGGLE_LIKE, seed=0)
    head = {"dlrm": "top", "wdl": "head", "deepfm": "deep", "dcn": "over"}[name]
    assert getattr(model, head)[0].in_features == first_top_in
    logits = model.eval()(torch.randn(2, 13), torch.randn(2, 26, table_dim(cfg)))
    assert logits.shape == (2,)

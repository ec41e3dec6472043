"""Shared small generators (module-scoped: building one calibrates κ and the teacher)."""

from __future__ import annotations

import pytest

from bagpipe.data import GeneratorConfig, SyntheticGenerator, get_preset


@pytest.fixture(scope="session")
def kaggle_gen() -> SyntheticGenerator:
    return SyntheticGenerator(get_preset("criteo_kaggle"), GeneratorConfig(scale=0.001, seed=3))


@pytest.fixture(scope="session")
def avazu_gen() -> SyntheticGenerator:
    return SyntheticGenerator(get_preset("avazu"), GeneratorConfig(scale=0.001, seed=3))

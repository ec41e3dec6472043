"""Evaluation, identical for every system: load ``full_state()`` into a ``ReferenceModel`` and score.

AUC is the rank statistic (Mann-Whitney U, ties averaged), computed exactly over all evaluation
examples; logloss is the mean binary cross-entropy of the logits. Beside them, the evaluation
labels' positive rate ``p`` and the logloss of the constant predictor ``p``
(:func:`base_rate_logloss`): a model whose logloss is not below it has learnt nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelState
from bagpipe.core.source import BatchSource
from bagpipe.models import ModelConfig, ReferenceModel
from bagpipe.training.step import bce_loss_sum


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels``; ``nan`` if one class is absent.

    ``AUC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` with ``R_pos`` the sum of the
    positives' 1-based ranks, tied scores sharing their average rank.
    """
    scores = scores.detach().reshape(-1).to(torch.float64)
    positive = labels.detach().reshape(-1) > 0.5
    n_pos = int(positive.sum())
    n_neg = positive.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(
        sorted_scores, return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).to(torch.float64)
    average_rank = ends - (counts.to(torch.float64) - 1.0) / 2.0
    ranks = average_rank[inverse]
    rank_sum = float(ranks[positive[order]].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def base_rate_logloss(positive_rate: float) -> float:
    """Logloss of always predicting ``p = positive_rate``: ``-(p ln p + (1-p) ln(1-p))``, the bar a
    model's logloss must beat to have learnt anything (0 for labels of one class)."""
    p = positive_rate
    if not 0.0 <= p <= 1.0:
        return math.nan
    return -sum(q * math.log(q) for q in (p, 1.0 - p) if q > 0.0)


@dataclass(frozen=True)
class EvalScores:
    auc: float
    logloss: float
    examples: int
    positive_rate: float = math.nan


class Evaluator:
    """Scores model states on one evaluation source, reusing one ``ReferenceModel``.

    Building the reference model allocates every table; the runner evaluates many times per run,
    so the model is built once and each evaluation only copies the state in.
    """

    def __init__(self, model_cfg: ModelConfig, schema: DatasetSchema, eval_source: BatchSource):
        if len(eval_source) == 0:
            raise ValueError("evaluation source has no batches")
        self._model = ReferenceModel(model_cfg, schema, seed=0, init_tables=False).eval()
        self._source = eval_source

    @torch.no_grad()
    def score(self, state: ModelState) -> EvalScores:
        self._model.load_state(state)
        logits, labels = [], []
        for batch in self._source:
            logits.append(self._model(batch))
            labels.append(batch.labels)
        all_logits, all_labels = torch.cat(logits), torch.cat(labels)
        logloss = float(bce_loss_sum(all_logits, all_labels)) / all_labels.numel()
        positive_rate = float((all_labels > 0.5).to(torch.float64).mean())
        return EvalScores(roc_auc(all_logits, all_labels), logloss, all_labels.numel(),
                          positive_rate)


def evaluate(
    state: ModelState, model_cfg: ModelConfig, schema: DatasetSchema, eval_source: BatchSource
) -> tuple[float, float]:
    """``(auc, logloss)`` of ``state`` on every batch of ``eval_source``."""
    scores = Evaluator(model_cfg, schema, eval_source).score(state)
    return scores.auc, scores.logloss

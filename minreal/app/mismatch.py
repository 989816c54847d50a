"""Does the data match the model? The original model's accuracy on labelled data, against chance.

A trained classifier that scores near chance on labelled data of its own task almost never means a bad model: the
inputs are preprocessed differently from its training (image size, normalisation) or the labels follow another
class order. Compressing against such data optimises noise and every measurement is meaningless, so ``run`` and
``tune`` stop (unless ``--allow-data-mismatch``) and ``compress`` warns.

The rule (:func:`chance_threshold`): with ``n`` labelled samples, ``K`` classes (the width of the model's output)
and chance ``p0 = max(1/K, share of the most common label)``, the accuracy is *near chance* when it is at most
``p0 + max(min(p0/2, 0.05), 3·sqrt(p0(1-p0)/n))``: within half of chance again (at most 5 points) of it, or within
three binomial standard errors, whichever is wider. When three standard errors already reach halfway from chance to
a perfect score, the sample is too small to tell, and the verdict is ``inconclusive`` (never an error).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from minreal.app.callables import SpecError
from minreal.compress.core.data import Dataset
from minreal.compress.core.evaluate import predict

__all__ = ["CHECK_SAMPLES", "DataCheck", "DataMismatchError", "Z_SCORE", "chance_threshold", "check_data",
           "is_conclusive", "require_match"]

Z_SCORE = 3.0
"""Binomial standard errors above chance still counted as chance."""
MAX_MARGIN = 0.05
"""The relative margin (half of chance) is capped at this many accuracy points (binary tasks: 55%, not 75%)."""
CHECK_SAMPLES = 512
"""Labelled samples the check runs the original on at most (seeded subset, evaluation data first)."""
CAUSES = ("likely causes: untrained weights (pass the trained ones with --weights), inputs prepared differently "
          "from training (arrays: the same scaling and tokenisation; image folders default to 224x224 with ImageNet "
          "statistics, see --image-size, --mean/--std or --preprocess WEIGHTS_ENTRY) or labels in another class "
          "order than the model's outputs")


class DataMismatchError(SpecError):
    """The original model scores near chance on the labelled data: the data does not match the model."""


@dataclass(frozen=True)
class DataCheck:
    """The original model's accuracy on labelled data against chance (``report.json``: ``data_check``).

    Attributes
    ----------
    verdict : str
        ``match``, ``near_chance``, ``inconclusive`` (too few samples to tell) or ``skipped``.
    reason : str
        why the check was skipped or inconclusive.
    data : list[str]
        the parts measured (``calibration``, ``evaluation``).
    samples : int
        labelled samples the original was run on.
    num_classes : int
        width of the model's output.
    accuracy, chance, threshold : float | None
        the original's accuracy, chance level and the highest accuracy counted as
        chance (fractions in [0, 1]).
    labels_out_of_range : int
        labels that no output of the model can predict (negative or >= num_classes).
    allowed : bool
        near chance, and the command went on because ``--allow-data-mismatch`` was given.
    """

    verdict: str
    reason: str = ""
    data: list[str] = field(default_factory=list)
    samples: int = 0
    num_classes: int = 0
    accuracy: float | None = None
    chance: float | None = None
    threshold: float | None = None
    labels_out_of_range: int = 0
    allowed: bool = False

    @property
    def near_chance(self) -> bool:
        return self.verdict == "near_chance"

    def message(self) -> str:
        """One line: the accuracy, the chance level, what that means and the likely causes."""
        assert self.accuracy is not None and self.chance is not None and self.threshold is not None
        base = f"1 of {self.num_classes} classes" if self.chance * self.num_classes <= 1 + 1e-9 else \
            f"always answering the most common label; {self.num_classes} classes"
        labels = (f"; {self.labels_out_of_range} of the labels lie outside the model's {self.num_classes} outputs "
                  f"(0-{self.num_classes - 1})" if self.labels_out_of_range else "")
        return (f"the original model's accuracy on the labelled {' and '.join(self.data)} data is "
                f"{self.accuracy:.1%} ({self.samples} samples), at chance level (chance {self.chance:.1%}: {base}; "
                f"up to {self.threshold:.1%} counts as chance): the data does not match the model{labels}; {CAUSES}")


def chance_threshold(chance: float, n: int, z: float = Z_SCORE) -> float:
    """Highest accuracy counted as chance: ``p0 + max(min(p0/2, 0.05), z·sqrt(p0(1-p0)/n))`` (normal approximation
    of the binomial count of correct answers by guessing, Wald)."""
    return chance + max(min(chance / 2, MAX_MARGIN), z * math.sqrt(chance * (1 - chance) / n))


def is_conclusive(chance: float, n: int, z: float = Z_SCORE) -> bool:
    """Whether ``n`` samples can tell chance from a model halfway to a perfect score: ``z`` standard errors of
    guessing stay below ``(1 + p0) / 2``."""
    return chance + z * math.sqrt(chance * (1 - chance) / n) < (1 + chance) / 2


def _labelled(parts: Mapping[str, Dataset | None]) -> dict[str, Dataset]:
    return {name: d for name, d in parts.items() if d is not None and len(d) and d.y is not None
            and d.y.dtype in (torch.int64, torch.int32) and d.y.ndim == 1}


def _subset(data: Dataset, limit: int, seed: int) -> Dataset:
    """A seeded random ``limit`` samples (all when fewer): image folders list their samples class by class."""
    if len(data) <= limit:
        return data
    idx = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:limit]
    return Dataset(data.x[idx], data.y[idx])  # type: ignore[index]


def _majority_share(parts: list[Dataset], k: int) -> float:
    """Share of the most common label among all labels of ``parts`` (not only the samples checked, so balanced
    data gives 1/K and not a sampling fluctuation above it) that the model can output at all (0 to k - 1)."""
    y = torch.cat([d.y for d in parts])  # type: ignore[misc]
    inside = y[(y >= 0) & (y < k)]
    return float(torch.bincount(inside, minlength=k).max()) / len(y)


def check_data(model: nn.Module, parts: Mapping[str, Dataset | None], max_samples: int = CHECK_SAMPLES,
               seed: int = 0) -> DataCheck:
    """Run ``model`` on up to ``max_samples`` labelled samples of ``parts`` (in order: put the evaluation data
    first) and compare its accuracy with chance (see the module's docstring for the rule).

    Skipped (verdict ``skipped``) when no part has integer class labels or the outputs are not class scores
    ``(N, K)`` with ``K > 1``.
    """
    labelled = _labelled(parts)
    if not labelled:
        return DataCheck("skipped", reason="the data has no integer class labels")
    correct, ys, used = 0, [], []
    for name, data in labelled.items():
        if sum(map(len, ys)) >= max_samples:
            break
        sub = _subset(data, max_samples - sum(map(len, ys)), seed)
        out = predict(model, sub)
        if out.dim() != 2 or out.shape[1] < 2:
            return DataCheck("skipped", reason=f"the model's outputs {tuple(out.shape)} are not class scores (N, K>1)")
        correct += int((out.argmax(1) == sub.y).sum())
        ys.append(sub.y)
        used.append(name)
        k = out.shape[1]
    y = torch.cat(ys)
    n = len(y)
    chance = max(1 / k, _majority_share(list(labelled.values()), k))
    accuracy, threshold = correct / n, chance_threshold(chance, n)
    outside = int(((y < 0) | (y >= k)).sum())
    common = {"data": used, "samples": n, "num_classes": k, "accuracy": accuracy, "chance": chance,
              "threshold": threshold, "labels_out_of_range": outside}
    if not is_conclusive(chance, n):
        return DataCheck("inconclusive", reason=f"{n} labelled samples are too few to tell a model from chance",
                         **common)
    return DataCheck("near_chance" if accuracy <= threshold else "match", **common)


def require_match(check: DataCheck, allow: bool) -> DataCheck:
    """``check`` as it is, or marked ``allowed`` when near chance and ``allow``; near chance otherwise raises.

    Raises
    ------
    DataMismatchError
        the accuracy is near chance and ``allow`` is False (one line, naming the way out).
    """
    if not check.near_chance:
        return check
    if not allow:
        raise DataMismatchError(f"{check.message()}; fix the data or pass --allow-data-mismatch to go on anyway")
    return replace(check, allowed=True)

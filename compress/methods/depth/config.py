"""Options of ``depth`` (torch-free: the registry and the command line read them without importing the method)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import field_error
from ...core.options import CostBudget, ExcludeOption, SeedOption

__all__ = ["DepthConfig", "CRITERIA", "DEFAULT_CRITERION", "DEFAULT_MAC_RATIO"]

#: How blocks are ranked for removal (:mod:`minreal.compress.methods.depth.criteria`), cheapest first.
CRITERIA = ("greedy", "removal", "observability", "energy")
#: ``benchmarks/depth.json``: after the shared recovery (10 epochs on 7,000 real CIFAR-10 images) of the pretrained
#: ResNet-32 and ResNet-44 at MAC 0.7, ``energy`` keeps the most held-out top-1 on average (ResNet-32: 82.05 % against
#: greedy 78.90, removal 79.95, observability 79.50; ResNet-44: 82.90 against greedy 83.25), and its ``prepare``
#: takes 2-5 s against greedy's 77-100 s. ``greedy`` keeps the most zero-shot (use it when no recovery follows).
DEFAULT_CRITERION = "energy"
#: The MAC budget when none is given.
DEFAULT_MAC_RATIO = 0.75


@dataclass
class DepthConfig(CostBudget, SeedOption, ExcludeOption):
    """Options of ``depth``: remove whole residual branches (``y = x + f(x)`` becomes ``y = x``) until one
    whole-model budget holds (``mac_ratio``, ``param_ratio``, or ``latency_ratio`` with a depth latency table);
    with none, ``mac_ratio`` 0.75. ``criterion`` orders the blocks (computed once in ``prepare``); ``exclude`` names
    blocks to keep (``layer3.0``). ``score_samples`` calibration samples score the blocks."""

    criterion: str = field(
        default=DEFAULT_CRITERION,
        metadata={"help": "How blocks are ranked for removal: greedy (remove, one at a time, the block whose removal "
                          "changes the outputs least, re-scored after each removal), removal (each block's output "
                          "change alone), observability (branch energy seen through the output Jacobian), energy "
                          f"(|f(x)|^2/|x|^2); default {DEFAULT_CRITERION}, the best after recovery; greedy is the "
                          "best with no recovery (benchmarks/depth.json).",
                  "choices": CRITERIA})
    score_samples: int = field(
        default=512,
        metadata={"help": "Calibration samples that score the blocks (a seeded subset), >= 8; default 512."})
    greedy_candidates: int = field(
        default=6,
        metadata={"help": "Blocks re-scored at each greedy step (those whose removal alone costs least), >= 1; "
                          "bounds the greedy order's cost to about this many passes per removed block; default 6."})
    observability_probes: int = field(
        default=4,
        metadata={"help": "Random output directions per batch estimating the observability-weighted energy, >= 1; "
                          "default 4."})

    def __post_init__(self) -> None:
        CostBudget.__post_init__(self)
        if self.criterion not in CRITERIA:
            raise field_error(self, "criterion", f"must be one of {', '.join(CRITERIA)}, got {self.criterion!r}")
        if self.score_samples < 8:
            raise field_error(self, "score_samples", f"must be >= 8, got {self.score_samples}")
        if self.greedy_candidates < 1:
            raise field_error(self, "greedy_candidates", f"must be >= 1, got {self.greedy_candidates}")
        if self.observability_probes < 1:
            raise field_error(self, "observability_probes", f"must be >= 1, got {self.observability_probes}")

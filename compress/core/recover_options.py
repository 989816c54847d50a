"""The options of the recovery (:func:`minreal.compress.core.recover.recover`), torch-free so that the command line
can show their defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CompressionError, field_error

__all__ = ["RecoveryConfig", "TASKS"]

#: ``RecoveryConfig.task``: what the outputs are (``auto``: told by the labels or the output shape).
TASKS = ("auto", "classification", "regression")


@dataclass
class RecoveryConfig:
    """Budget and schedule of the recovery; ``epochs`` and ``steps`` both 0 (the default) turn it off.

    Notes
    -----
    Eight fields share their names with :class:`minreal.compress.core.train.TrainConfig` (``epochs``, ``batch_size``,
    ``lr``, ``weight_decay``, ``patience``, ``alpha``, ``temperature``, ``seed``) and are left declared in both on
    purpose: they configure two loops and do not hold the same facts. ``alpha`` weighs the label loss here,
    ``(1 - alpha)·distillation + alpha·labels`` (``--recover-alpha 1``: the labels alone), and the distillation there
    (``alpha·distillation + (1 - alpha)·labels``); ``weight_decay`` is AdamW's decoupled decay here and Adam's L2 term
    there; ``epochs``, ``lr``, ``patience`` and ``alpha`` have other defaults (a recovery is off unless asked for and
    starts from trained weights; a method's own training starts from scratch). A shared class would give one name to
    two meanings.
    """

    epochs: int = 0
    steps: int = 0
    alpha: float = 0.5
    """Weight of the label loss (cross-entropy or MSE) against the distillation loss; 0 = pure distillation. Used
    only when the data has labels."""
    temperature: float = 4.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 64
    """Samples per optimiser step; under DDP the global batch, of which each rank takes ``batch_size / world``."""
    warmup: float = 0.1
    """Fraction of the steps with a linear learning-rate warm-up before the cosine decay."""
    val_fraction: float = 0.2
    """Share of the data held out (seeded) for early stopping and the before/after metrics; 0 holds none out."""
    patience: int = 3
    seed: int = 0
    features: tuple[str, ...] = ()
    """Module names whose outputs the student matches to the teacher's; ``("auto",)`` takes the layers the
    method changed (its own state points). Points whose output shape differs between the two are skipped."""
    feature_weight: float = 1.0
    """Weight of the feature-matching term against the output loss."""
    int8: str | None = None
    """Quantisation-aware recovery in this target's INT8 format (a key of ``qat.INT8_FORMATS``); None: float."""
    task: str = "auto"
    """``classification`` (KL on softened logits, agreement), ``regression`` (MSE to the original) or ``auto``:
    integer labels mean classification, float labels regression; without labels, outputs of shape (batch, k > 1)
    are taken for logits (give ``regression`` for an unlabelled multi-output regressor)."""
    catch_interrupt: bool = True
    """Whether a KeyboardInterrupt ends this recovery early (the first Ctrl-C of a command); a caller that already
    had one turns this off so that the second aborts. Under DDP the first SIGINT on any rank ends it on all ranks
    after the same step."""
    freeze_batchnorm: bool | None = None
    """BatchNorm layers normalise by their running statistics during the steps (re-estimated before the first
    epoch and after each) instead of by each batch's; their affine parameters still train. None: frozen under DDP
    (a process group of more than one rank, which requires it), batch statistics in a single process."""

    def __post_init__(self) -> None:
        checks = [  # (holds, field, what is wrong with it); the flag too where tests/compress/core/test_recover.py
            # reads it (the command line shows the flag once)
            (self.epochs >= 0, "epochs", f"(--recover-epochs) must be >= 0, got {self.epochs}"),
            (self.steps >= 0, "steps", f"(--recover-steps) must be >= 0, got {self.steps}"),
            (0.0 <= self.alpha <= 1.0, "alpha", f"(--recover-alpha) must lie in [0, 1], got {self.alpha}"),
            (self.temperature > 0, "temperature", f"(--recover-temperature) must be > 0, got {self.temperature}"),
            (self.lr > 0, "lr", f"(--recover-lr) must be > 0, got {self.lr}"),
            (0.0 <= self.val_fraction < 1.0, "val_fraction",
             f"(--recover-val-fraction) must lie in [0, 1), got {self.val_fraction}"),
            (self.patience >= 1, "patience", f"(--recover-patience) must be >= 1, got {self.patience}"),
            (self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}"),
            (self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}"),
            (0.0 <= self.warmup < 1.0, "warmup", f"must lie in [0, 1), got {self.warmup}"),
            (self.feature_weight >= 0, "feature_weight", f"must be >= 0, got {self.feature_weight}"),
            ("auto" not in self.features or len(self.features) == 1,
             "features", f"takes 'auto' alone or module names, got {list(self.features)}"),
            (self.task in TASKS, "task", f"must be one of {', '.join(TASKS)}, got {self.task!r}"),
        ]
        for ok, name, problem in checks:
            if not ok:
                raise field_error(self, name, problem)
        if self.epochs and self.steps:
            raise CompressionError("give `RecoveryConfig.epochs` (--recover-epochs) or `RecoveryConfig.steps` "
                                   f"(--recover-steps), not both (got {self.epochs} and {self.steps})",
                                   fields=("epochs", "steps"))
        if self.int8 is not None:
            from .qat import INT8_FORMATS  # torch: only for a quantisation-aware recovery

            if self.int8 not in INT8_FORMATS:
                raise field_error(self, "int8", f"has no INT8 format for target {self.int8!r}; choose one of "
                                                f"{', '.join(INT8_FORMATS)}")

    @property
    def enabled(self) -> bool:
        return self.epochs > 0 or self.steps > 0

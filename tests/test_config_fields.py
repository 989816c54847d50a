"""One home per setting: a config that composes others (a run's, a tune's, a variant's INT8 settings) declares none of
their fields again; a name two of them declare is a homonym, another fact under the same name, listed here with the
reason. ``RecoveryConfig`` and ``TrainConfig`` share eight names and are left apart on purpose (their docstrings say
why); the facts that make them different are checked here."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from minreal.app.settings import PipelineConfig
from minreal.app.tune import TuneConfig
from minreal.compress.core.recover import _loss
from minreal.compress.core.recover_options import RecoveryConfig
from minreal.compress.core.train import TrainConfig, _distill_loss, distillation_loss, task_loss
from minreal.export.int8 import QuantConfig
from minreal.export.settings import Int8Policy, OrtConfig, VariantConfig
from minreal.runtime_bench import BenchConfig

#: Each config -> the configs it holds or builds (a variant builds its quantiser's settings, ``quant_config``).
COMPOSES: dict[type, tuple[type, ...]] = {
    PipelineConfig: (BenchConfig, VariantConfig, RecoveryConfig, OrtConfig),
    TuneConfig: (BenchConfig, VariantConfig, OrtConfig),
    VariantConfig: (QuantConfig,),
}
#: Names declared twice within one composition, each another fact in each class.
HOMONYMS = {
    "int8": "PipelineConfig.int8 makes INT8 copies (a switch); RecoveryConfig.int8 is the target a recovery "
            "fake-quantises in (a name or None)",
    "warmup": "BenchConfig.warmup counts discarded timing runs; RecoveryConfig.warmup is the share of optimiser "
              "steps with a rising learning rate",
    "batch_size": "QuantConfig.batch_size is the calibration batch (it changes no range); RecoveryConfig.batch_size "
                  "the optimiser's",
    "seed": "QuantConfig.seed seeds random calibration data; RecoveryConfig.seed the held-out split and the shuffles",
}
#: The names RecoveryConfig and TrainConfig share, and those of them whose defaults differ.
RECOVERY_AND_TRAIN = {"epochs", "batch_size", "lr", "weight_decay", "patience", "alpha", "temperature", "seed"}
OTHER_DEFAULTS = {"epochs", "lr", "patience", "alpha"}


def _declared(cls: type) -> set[str]:
    """The fields ``cls`` declares itself (not those of a base class, nor a ``KW_ONLY`` marker)."""
    return set(cls.__dict__.get("__annotations__", {})) & {f.name for f in dataclasses.fields(cls)}


def _group(cls: type) -> list[type]:
    """``cls``, the configs it composes (and theirs), and the dataclass bases of each."""
    seen: list[type] = []
    todo = [cls]
    while todo:
        c = todo.pop()
        for k in c.__mro__:
            if dataclasses.is_dataclass(k) and k not in seen:
                seen.append(k)
        todo.extend(COMPOSES.get(c, ()))
    return seen


def _twice(classes: list[type]) -> dict[str, list[str]]:
    owners: dict[str, list[str]] = collections.defaultdict(list)
    for c in classes:
        for name in _declared(c):
            owners[name].append(c.__name__)
    return {name: sorted(o) for name, o in owners.items() if len(o) > 1}


@pytest.mark.parametrize("top", list(COMPOSES), ids=lambda c: c.__name__)
def test_no_field_is_declared_twice_among_the_composed_configs(top: type) -> None:
    twice = _twice(_group(top))
    assert set(twice) <= set(HOMONYMS), {n: o for n, o in twice.items() if n not in HOMONYMS}


def test_every_homonym_listed_is_still_declared_twice_somewhere() -> None:
    found = set().union(*(_twice(_group(top)) for top in COMPOSES))
    assert found == set(HOMONYMS)


def test_a_variant_and_its_quantiser_share_the_int8_policy_declared_once() -> None:
    shared = {f.name for f in dataclasses.fields(Int8Policy)}
    assert shared == {"allow_random_calibration", "drop_roundtrips"}
    assert not shared & (_declared(VariantConfig) | _declared(QuantConfig))
    assert issubclass(VariantConfig, Int8Policy) and issubclass(QuantConfig, Int8Policy)
    quant = VariantConfig(quant_target="cpu-avx2", quant_mode="dynamic", allow_random_calibration=True,
                          drop_roundtrips=False).quant_config()
    assert (quant.target, quant.mode, quant.allow_random_calibration, quant.drop_roundtrips) == \
        ("cpu-avx2", "dynamic", True, False)
    assert VariantConfig().quant_config() == QuantConfig()  # the same defaults, declared once


def test_recovery_and_training_share_names_not_facts() -> None:
    assert _declared(RecoveryConfig) & _declared(TrainConfig) == RECOVERY_AND_TRAIN
    recovery, training = RecoveryConfig(), TrainConfig()
    differ = {n for n in RECOVERY_AND_TRAIN if getattr(recovery, n) != getattr(training, n)}
    assert differ == OTHER_DEFAULTS


def test_alpha_weighs_the_labels_in_a_recovery_and_the_teacher_in_a_training() -> None:
    """At alpha = 1 a recovery trains on the labels alone (``--recover-alpha 1``), a training on the teacher alone."""
    torch.manual_seed(0)
    out, teacher, y = torch.randn(8, 5), torch.randn(8, 5), torch.randint(0, 5, (8,))
    recovered = _loss(out, teacher, y, RecoveryConfig(alpha=1.0, task="classification"))
    trained = _distill_loss(out, teacher, y, TrainConfig(alpha=1.0, temperature=4.0))
    assert torch.allclose(recovered, task_loss(out, y))
    assert torch.allclose(trained, distillation_loss(out, teacher, 4.0, classifier=True))
    assert not torch.allclose(task_loss(out, y), distillation_loss(out, teacher, 4.0, classifier=True))


def test_a_positional_argument_where_the_int8_policy_was_is_refused_not_shifted() -> None:
    # the former order: ..., calib_samples, allow_random_calibration, fixed_shapes, ... (VariantConfig) and
    # ..., batch_size, allow_random_calibration, random_samples, ... (QuantConfig)
    with pytest.raises(TypeError):
        VariantConfig(18, 1e-4, 1e-5, "cpu", "static", 256, True)
    with pytest.raises(TypeError):
        QuantConfig("static", "cpu", None, None, "int8", None, True, "minmax", 16, True)
    assert VariantConfig(18, 1e-4, 1e-5, "cpu", "static", 256).calib_samples == 256  # the fields before it still are
    assert QuantConfig("static", "cpu", None, None, "int8", None, True, "minmax", 16).batch_size == 16

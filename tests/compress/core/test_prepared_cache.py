"""Prepared states cached on disk: factorize's state round-trips, the key follows exactly what the state depends on,
and a file is only ever read as plain data (no unpickling, dataclasses of compress only)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import minreal.compress.methods.factorize.method as factorize_method
from minreal.compress.core import prepared_cache
from minreal.compress.core.costs import CostTable, LayerCost
from minreal.compress.core.data import Dataset
from minreal.compress.core.inputs import NamedInputs
from minreal.compress.core.prepared_cache import load_prepared, prepared_cache_key, prepared_path, save_prepared
from minreal.compress.methods.factorize.smoke import smoke_case
from minreal.compress.registry import prepare, prepared_key, realise

RTOL, ATOL = 1e-5, 1e-6  # float32 outputs of two realisations from equal float64 bases


@pytest.fixture()
def case():
    return smoke_case()


@pytest.fixture()
def counted(monkeypatch):
    """Counts the statistics passes factorize runs."""
    calls = []
    real = factorize_method.collect_moments

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(factorize_method, "collect_moments", spy)
    return calls


def _outputs(prepared, config, x):
    model, _ = realise(prepared, config)
    with torch.no_grad():
        return model(x)


def test_factorize_state_round_trips(case, tmp_path):
    computed = prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    loaded = prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    assert not computed.cached and loaded.cached
    assert loaded.key == computed.key
    assert loaded.state.unfused.model is case.model
    assert all(t.layer is case.model.get_submodule(t.name) for t in loaded.state.targets)
    for name, basis in computed.state.bases.items():
        torch.testing.assert_close(loaded.state.bases[name].basis, basis.basis, rtol=0, atol=0)
    x = case.data.x[:32]
    for budget in (0.3, 0.6):
        config = dataclasses.replace(case.config, mac_ratio=budget, layer_mac_ratio=None)
        torch.testing.assert_close(_outputs(loaded, config, x), _outputs(computed, config, x), rtol=RTOL, atol=ATOL)


def test_second_prepare_is_a_hit_without_statistics(case, tmp_path, counted):
    prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    assert len(counted) == 1
    again = prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    assert again.cached and len(counted) == 1


def test_without_cache_dir_nothing_is_cached(case, tmp_path, counted):
    for _ in range(2):
        assert not prepare(case.model, case.data, "factorize", case.config).cached
    assert len(counted) == 2


def _changed_weight(case):
    model = copy.deepcopy(case.model)
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    return model, case.data, case.config


def _changed_input_byte(case):
    x = case.data.x.clone()
    x.view(torch.uint8).view(-1)[5] ^= 1
    return case.model, Dataset(x, case.data.y), case.config


def _changed_label(case):
    y = case.data.y.clone()
    y[0] = (y[0] + 1) % 10
    return case.model, Dataset(case.data.x, y), case.config


def _changed_option(case):
    return case.model, case.data, dataclasses.replace(case.config, eig_threshold=1e-8)


def _changed_budget(case):
    return case.model, case.data, dataclasses.replace(case.config, layer_mac_ratio=None, mac_ratio=0.4)


@pytest.mark.parametrize("change, hit", [(_changed_weight, False), (_changed_input_byte, False),
                                         (_changed_label, False), (_changed_option, False), (_changed_budget, True)])
def test_key_follows_what_the_state_depends_on(case, tmp_path, counted, change, hit):
    prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    model, data, config = change(case)
    again = prepare(model, data, "factorize", config, cache_dir=tmp_path)
    assert again.cached is hit
    assert len(counted) == (1 if hit else 2)


def test_package_version_is_part_of_the_key(case, monkeypatch):
    key = prepared_key("factorize", case.config)
    before = prepared_cache_key("factorize", key, case.model, case.data)
    monkeypatch.setattr(prepared_cache, "version", lambda name: "999.0")
    assert prepared_cache.package_versions()[:-1] == tuple((n, "999.0") for n in prepared_cache.VERSIONED)
    assert prepared_cache_key("factorize", key, case.model, case.data) != before


def test_a_change_to_the_code_is_part_of_the_key(case, monkeypatch, tmp_path):
    """minreal's version number stays put while its code changes: the key also hashes the package's sources."""
    key = prepared_key("factorize", case.config)
    before = prepared_cache_key("factorize", key, case.model, case.data)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("A = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = prepared_cache.source_digest("pkg")
    monkeypatch.setattr(prepared_cache, "_DIGESTS", {})
    (tmp_path / "pkg" / "__init__.py").write_text("A = 2\n")
    assert prepared_cache.source_digest("pkg") != first
    monkeypatch.setattr(prepared_cache, "source_digest", lambda *packages: "changed")
    assert prepared_cache_key("factorize", key, case.model, case.data) != before


@pytest.mark.parametrize("content", [b"", b"not a torch file", "truncated"])
def test_corrupt_file_is_a_miss_and_overwritten(case, tmp_path, counted, content):
    prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path)
    (path,) = (tmp_path / "prepared").iterdir()
    whole = path.read_bytes()
    broken = whole[: len(whole) // 2] if content == "truncated" else content
    path.write_bytes(broken)
    assert not prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path).cached
    assert path.read_bytes() != broken and len(counted) == 2
    assert prepare(case.model, case.data, "factorize", case.config, cache_dir=tmp_path).cached


def _write(cache_dir: Path, key: str, state: object) -> Path:
    path = prepared_path(cache_dir, key)
    path.parent.mkdir(parents=True)
    torch.save({"schema": prepared_cache.SCHEMA, "key": key, "state": state}, path)
    return path


@dataclasses.dataclass
class Outsider:
    """A dataclass outside compress: a file naming it must not be rebuilt."""

    value: int = 0


@pytest.mark.parametrize("name", [f"{Outsider.__module__}:{Outsider.__qualname__}", "os:system",
                                  "compressx.evil:Thing", "minreal.compress.core.inputs:NamedInputs",
                                  "minreal.compress.core.costs:CostTable.__init__.__globals__"])
def test_file_naming_a_class_outside_compress_is_refused(case, tmp_path, monkeypatch, name):
    imported = []
    real = prepared_cache.import_module
    monkeypatch.setattr(prepared_cache, "import_module", lambda m: imported.append(m) or real(m))
    _write(tmp_path, "k", {"__dataclass__": name, "fields": {"value": 1}})
    assert load_prepared(tmp_path, "k", case.model) is None
    assert all(m == "minreal.compress" or m.startswith("minreal.compress.") for m in imported)


def test_nothing_is_unpickled(case, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    path = _write(tmp_path, "k", {"__dict__": [("x", Payload())]})
    assert load_prepared(tmp_path, "k", case.model) is None
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the file does carry code: plain unpickling runs it
    assert marker.exists()


def test_foreign_layout_is_a_miss(case, tmp_path):
    _write(tmp_path, "k", {"__unknown__": 1})
    assert load_prepared(tmp_path, "k", case.model) is None
    _write(tmp_path / "other", "k", [1, 2])
    assert load_prepared(tmp_path / "other", "wrong key", case.model) is None


def test_encoding_round_trips_every_kind_of_leaf(case, tmp_path):
    model = case.model
    first = next(model.parameters())
    name, sub = next((n, m) for n, m in model.named_modules() if n)
    state = {
        "model": model, ("tuple", 1): [sub, first],
        "table": CostTable({"a": LayerCost("a", "linear", 3, 4)}, ["b"], 7),
        "arrays": (np.arange(6, dtype=np.float32).reshape(2, 3), np.float64(2.5), np.int64(3)),
        "misc": {frozenset({1, 2}), None, 1.5, True, "s"}, "dtype": torch.float16, "device": torch.device("cpu"),
        "named": NamedInputs({"a": torch.ones(4, 2), "b": torch.zeros(4)}), "slice": case.data.x[:2],
    }
    assert save_prepared(tmp_path, "k", state, model)
    loaded = load_prepared(tmp_path, "k", model)
    assert loaded["model"] is model and loaded[("tuple", 1)] == [model.get_submodule(name), first]
    assert loaded[("tuple", 1)][0] is sub and loaded[("tuple", 1)][1] is first
    assert loaded["table"] == state["table"]
    np.testing.assert_array_equal(loaded["arrays"][0], state["arrays"][0])
    assert [type(a) for a in loaded["arrays"]] == [np.ndarray, np.float64, np.int64]
    assert loaded["misc"] == state["misc"] and loaded["dtype"] is torch.float16
    assert loaded["device"] == torch.device("cpu") and loaded["named"].names == ["a", "b"]
    torch.testing.assert_close(loaded["slice"], case.data.x[:2])
    assert loaded["slice"].untyped_storage().nbytes() == loaded["slice"].numel() * 4  # not the whole data


@pytest.mark.parametrize("bad", [lambda m: copy.deepcopy(m), lambda m: len, lambda m: Outsider(),
                                 lambda m: object(), lambda m: np.array([object()])])
def test_other_objects_are_not_cached(case, tmp_path, caplog, bad):
    with caplog.at_level(logging.INFO, logger=prepared_cache.__name__):
        assert not save_prepared(tmp_path, "k", {"ok": 1, "bad": [bad(case.model)]}, case.model)
    assert not prepared_path(tmp_path, "k").exists()
    assert len([r for r in caplog.records if "not cached" in r.getMessage()]) == 1


def test_only_the_writer_saves_and_loads_agree(case, tmp_path, monkeypatch):
    monkeypatch.setattr(prepared_cache, "is_writer", lambda: False)
    assert not save_prepared(tmp_path, "k", {"a": 1}, case.model)
    assert not prepared_path(tmp_path, "k").exists()
    monkeypatch.setattr(prepared_cache, "is_writer", lambda: True)
    assert save_prepared(tmp_path, "k", {"a": 1}, case.model)
    monkeypatch.setattr(prepared_cache, "all_agree", lambda flag: False)  # another rank could not read it
    assert load_prepared(tmp_path, "k", case.model) is None


def test_the_code_digest_hashes_real_sources_and_refuses_a_missing_package(tmp_path, monkeypatch):
    """A name that imports nothing would hash nothing and keep stale entries forever: it is an error. A plain
    module (``minreal.facts``) is hashed by its file."""
    monkeypatch.setattr(prepared_cache, "_DIGESTS", {})
    with pytest.raises(ImportError, match="no_such_package"):
        prepared_cache.source_digest("no_such_package")
    (tmp_path / "solo.py").write_text("B = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = prepared_cache.source_digest("solo")
    monkeypatch.setattr(prepared_cache, "_DIGESTS", {})
    (tmp_path / "solo.py").write_text("B = 2\n")
    assert prepared_cache.source_digest("solo") != first
    assert prepared_cache.source_digest("minreal.compress") != prepared_cache.source_digest("minreal.facts")


def test_a_tied_and_an_untied_model_with_one_state_dict_have_two_keys(tmp_path, counted):
    """A head holding its embedding's parameter and one holding a copy have the same state dict, but factorize
    leaves the tied head whole: the two must not share a prepared state (found in review: the untied model read the
    tied one's state and kept the head skipped; the other order factorised a tied head)."""
    from torch import nn

    class TiedLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.body, self.head = nn.Embedding(40, 16), nn.Linear(16, 16), nn.Linear(16, 40, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.body(self.embed(ids))))

    torch.manual_seed(0)
    tied = TiedLM().eval()
    untied = copy.deepcopy(tied)
    untied.head.weight = nn.Parameter(untied.head.weight.detach().clone())
    assert set(tied.state_dict()) == set(untied.state_dict())
    data = Dataset(torch.randint(0, 40, (32, 5), generator=torch.Generator().manual_seed(0)))
    config = factorize_method.FactorizeConfig(layer_mac_ratio=0.6)
    key = prepared_key("factorize", config)
    assert prepared_cache_key("factorize", key, tied, data) != prepared_cache_key("factorize", key, untied, data)
    prepare(tied, data, "factorize", config, cache_dir=tmp_path)
    again = prepare(untied, data, "factorize", config, cache_dir=tmp_path)
    assert not again.cached and len(counted) == 2
    _, report = realise(again, config)
    assert next(lr for lr in report.layers if lr.name == "head").action != "skipped"

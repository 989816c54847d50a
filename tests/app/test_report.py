"""Run-report views: spectra plot written only when a method reports spectra."""

from pathlib import Path

from minreal.app.report import plot_spectra, spectra_layers


def _report(spectra: dict | None) -> dict:
    """A run report whose variant carries ``spectra`` in the typed CompressionReport field (not in details)."""
    variant = {"label": "cb", "compression": {"layers": [{"name": "2", "details": {}}],
                                              "spectra": {"2": spectra} if spectra else {}}}
    return {"cases": [{"name": "c", "variants": [variant]}]}


def test_spectra_plot_written_when_present(tmp_path: Path) -> None:
    rep = _report({"A": [4.0, 2.0, 1.0], "B": [1.0, 0.5, 0.0], "C": [2.0, 0.1, 0.0]})
    assert [name for _, name, _ in spectra_layers(rep)] == ["cb: 2"]
    assert plot_spectra(rep, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_spectra_no_plot(tmp_path: Path) -> None:
    assert not plot_spectra(_report(None), tmp_path / "s.png")
    assert not (tmp_path / "s.png").exists()


def test_a_variant_without_a_bound_is_rendered_as_such() -> None:
    """fde after fine-tuning has ``bounds = {"output": None}``: the report says so instead of crashing."""
    from minreal.app.report import _budget_and_bounds

    lines = _budget_and_bounds("fde-ft", {"bounds": {"output": None, "blocks.0": 0.25}})
    assert lines == ["- **fde-ft** error bounds: output=none (no bound holds for this variant), blocks.0=0.25"]

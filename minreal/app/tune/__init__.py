"""`minreal tune`: search structure × precision × recovery for the fastest model within a quality constraint.

One module per concern: the options (:mod:`.config`), what a tune finds (:mod:`.model`), the search (:mod:`.search`,
:mod:`.halving`, :mod:`.candidate`), what ONNX Runtime measures of the files (:mod:`.measure`), the choice
(:mod:`.front`, :mod:`.choice`), what it writes (:mod:`.output`), and the entry point that orders them
(:mod:`.orchestrate`). The options import no torch, so the CLI checks them before the heavy imports; the rest loads
on first use.
"""

from minreal.compress.core.lazy import lazy_exports

from .config import DEFAULT_GRID, SCREEN, Constraint, Protocol, Quality, TuneConfig, TuneError, parse_duration

__all__ = ["tune", "TuneConfig", "TuneReport", "Candidate", "Constraint", "Quality", "Protocol", "SCREEN",
           "DEFAULT_GRID", "TuneError", "parse_duration", "Executor", "InlineExecutor", "ProcessExecutor", "Point",
           "choose", "pareto_front", "CandidateSpec", "SpecSource", "LoadedSource", "BASELINES", "default_methods"]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("CandidateSpec", "LoadedSource", "SpecSource"), ".candidate"),
    **dict.fromkeys(("Executor", "InlineExecutor", "ProcessExecutor"), ".executor"),
    **dict.fromkeys(("Point", "choose", "pareto_front"), ".front"),
    **dict.fromkeys(("BASELINES", "Candidate", "TuneReport"), ".model"),
    "default_methods": ".search",
    "tune": ".orchestrate",
})

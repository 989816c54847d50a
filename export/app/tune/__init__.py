"""`minreal tune`: search structure × precision × recovery for the fastest model within a quality constraint."""

from .candidate import CandidateSpec, LoadedSource, SpecSource
from .config import CONFIRM, DEFAULT_GRID, SCREEN, Constraint, Protocol, Quality, TuneConfig, TuneError, parse_duration
from .executor import Executor, InlineExecutor, ProcessExecutor
from .front import Point, choose, pareto_front
from .run import BASELINES, Candidate, TuneReport, default_methods, tune

__all__ = ["tune", "TuneConfig", "TuneReport", "Candidate", "Constraint", "Quality", "Protocol", "SCREEN", "CONFIRM",
           "DEFAULT_GRID", "TuneError", "parse_duration", "Executor", "InlineExecutor", "ProcessExecutor", "Point",
           "choose", "pareto_front", "CandidateSpec", "SpecSource", "LoadedSource", "BASELINES", "default_methods"]

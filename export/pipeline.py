"""Former home of the end-to-end pipeline, now :mod:`export.app.pipeline`; re-exports its public names so
existing imports keep working."""

from export.app.pipeline import *  # noqa: F401,F403 - the re-export is this module's purpose
from export.app.pipeline import __all__  # noqa: F401

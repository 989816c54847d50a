"""Width surgery on any traceable model: channel groups from the traced graph and one cut for every method."""

from .analysis import analyse
from .graph import ChannelGroup, Rewrite, Use, WidthGraph, param_owner
from .probe import capture, channels_last
from .surgery import Cut, SlimAttention, apply_cuts
from .tracing import is_exported_program, trace

__all__ = ["ChannelGroup", "Rewrite", "Use", "WidthGraph", "analyse", "trace", "Cut", "SlimAttention",
           "apply_cuts", "capture", "channels_last", "is_exported_program", "param_owner"]

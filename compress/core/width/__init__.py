"""Width surgery on any traceable model: channel groups from the traced graph and one cut for every method."""

from .graph import ChannelGroup, Rewrite, Use, WidthGraph, analyse, trace
from .probe import capture, channels_last
from .surgery import Cut, SlimAttention, apply_cuts, widths_after

__all__ = ["ChannelGroup", "Rewrite", "Use", "WidthGraph", "analyse", "trace", "Cut", "SlimAttention",
           "apply_cuts", "widths_after", "capture", "channels_last"]

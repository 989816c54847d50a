"""Retries that clean up a quantised graph: non-finite scales left in float, and float round trips dropped.

A calibrated scale that is not finite (an infinite value, e.g. a 0/-inf attention mask) flattens everything
downstream, so its nodes are left in float and the model quantised again (:func:`run_static_finite`). Nodes that
ONNX Runtime's optimised CPU graph runs in float between a DequantizeLinear and a QuantizeLinear cost a dequantise
and a re-quantise with nothing gained; :func:`drop_roundtrips` leaves them in float where that removes the pair.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from minreal.export.errors import QuantizationError
from minreal.export.int8.calibration import RangeSource
from minreal.export.int8.config import QuantConfig
from minreal.export.int8.ops import nonfinite_scale_nodes, nonfinite_scales, qdq_cost
from minreal.export.int8.passes import run_static
from minreal.runtime_bench.model_info import optimized_graph

__all__ = ["run_static_finite", "drop_roundtrips"]

logger = logging.getLogger(__name__)


_NONFINITE_ROUNDS = 4
_ROUNDTRIP_ROUNDS = 4


def run_static_finite(source: Path, dest: Path, ranges: RangeSource, config: QuantConfig,
                      overrides: Mapping[str, list[dict[str, np.ndarray]]], excluded: list[str],
                      label: str) -> list[str]:
    """:func:`run_static`, then again with the nodes around non-finite scales in float until none is left (a few
    rounds at most: each round only adds nodes). Returns the nodes it added to ``excluded``; ``label`` names the
    user's file in messages."""
    added: list[str] = []
    for _ in range(_NONFINITE_ROUNDS):
        run_static(source, dest, ranges, config, overrides, [*excluded, *added])
        written = onnx.load(str(dest), load_external_data=False)
        if not nonfinite_scales(written):
            if added:
                logger.warning("%s: calibration gave non-finite scales (an infinite value, e.g. a -inf attention "
                               "mask) around %d node(s), left in float: %s", label, len(added), ", ".join(added))
            return added
        new = [n for n in nonfinite_scale_nodes(written) if n not in added]
        if not new:
            raise QuantizationError(f"{label}: non-finite quantisation scales on tensors of unnamed nodes, which "
                                    "cannot be left in float; name the nodes or exclude them by hand")
        added += new
    raise QuantizationError(f"{label}: non-finite quantisation scales remain after {_NONFINITE_ROUNDS} rounds of "
                            f"leaving their nodes in float ({', '.join(added)}); exclude them by hand")


def drop_roundtrips(source: Path, dest: Path, ranges: RangeSource, config: QuantConfig,
                    overrides: Mapping[str, list[dict[str, np.ndarray]]], excluded: list[str],
                    graph: onnx.GraphProto) -> tuple[list[str], onnx.GraphProto]:
    """Quantise ``source`` again into ``dest`` with the nodes that ORT's CPU graph of ``dest`` (``graph``) runs in
    float between a DequantizeLinear and a QuantizeLinear (named in ``source``) left in float, a few rounds at most.

    An exclusion is kept only where its round trip is gone (a quantised neighbour can keep the tensor quantised),
    and the new file only if ORT's graph has fewer Q/DQ nodes and no fewer integer kernels than the first; otherwise
    the first file is restored. Returns the nodes it added to ``excluded`` (those whose round trip it removed) and
    ORT's CPU graph of the file it leaves.
    """
    names = {n.name for n in onnx.load(str(source), load_external_data=False).graph.node if n.name}
    first, first_graph = dest.read_bytes(), graph
    qdq0, int0, trips = qdq_cost(graph)
    kept: list[str] = []
    tried: set[str] = set()
    for last in (i == _ROUNDTRIP_ROUNDS - 1 for i in range(_ROUNDTRIP_ROUNDS)):
        stale = [n for n in kept if n in trips]
        new = [] if last else sorted(n for n in trips if n in names and n not in tried and n not in excluded)
        if not stale and not new:
            break
        kept, tried = [n for n in kept if n not in trips] + new, tried | set(new)
        run_static(source, dest, ranges, config, overrides, [*excluded, *kept])
        graph = optimized_graph(dest, "cpu")
        qdq, integer, trips = qdq_cost(graph)
    if kept and not (qdq < qdq0 and integer >= int0):
        dest.write_bytes(first)
        return [], first_graph
    if kept:
        logger.info("%s: %d node(s) ran in float between a dequantise and a re-quantise; left in float: %s",
                    dest.name, len(kept), ", ".join(kept))
    return kept, graph

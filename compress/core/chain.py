"""Linear-chain view of an MLP (``Linear → act → … → Linear``) shared by ``fde`` and the pruning baselines.

Reading a model into a :class:`Chain` folds BatchNorm1d into the adjacent Linear (in float64) and drops
Dropout/Flatten; :func:`build_sequential` emits a plain ``Flatten → Linear → act → … → Linear`` stack.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import CompressionError
from .report import LayerReport

__all__ = ["ActSpec", "Chain", "extract_chain", "build_sequential", "chain_forward", "chain_layer_reports",
           "fold_bn_after", "ACT_KINDS", "mlp_params"]

ACT_KINDS: dict[type[nn.Module], str] = {
    nn.ReLU: "relu", nn.LeakyReLU: "leaky_relu", nn.SiLU: "silu", nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid", nn.GELU: "gelu", nn.Identity: "identity",
}
_SKIPPED = (nn.Flatten, nn.Dropout)


@dataclass(frozen=True)
class ActSpec:
    """A hidden activation: its kind, LeakyReLU's negative slope, and the module to emit."""

    kind: str
    negative_slope: float = 0.0
    module: nn.Module | None = field(default=None, compare=False, repr=False)

    @property
    def homogeneous(self) -> bool:
        """Positively homogeneous: σ(ρz) = ρσ(z) for ρ > 0."""
        return self.kind in ("relu", "leaky_relu", "identity")

    @property
    def linear(self) -> bool:
        return self.kind == "identity"

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.module(z) if self.module is not None else z

    @staticmethod
    def of(module: nn.Module | None) -> "ActSpec":
        if module is None:
            return ActSpec("identity", 0.0, nn.Identity())
        slope = float(getattr(module, "negative_slope", 0.0))
        return ActSpec(ACT_KINDS[type(module)], slope, copy.deepcopy(module))


@dataclass
class Chain:
    """``z_l = W_l h_{l-1} + b_l``, ``h_l = σ_l(z_l)`` for hidden layers; the last Linear is the output.

    ``weights``/``biases`` are float64; ``groups[l][k]`` lists the original neurons of hidden layer ``l``
    represented by its ``k``-th (compact) neuron.
    """

    weights: list[torch.Tensor]
    biases: list[torch.Tensor]
    acts: list[ActSpec]
    groups: list[list[list[int]]]
    dtype: torch.dtype = torch.float32

    @property
    def widths(self) -> list[int]:
        """Hidden widths."""
        return [w.shape[0] for w in self.weights[:-1]]

    @property
    def params(self) -> int:
        return sum(w.numel() + b.numel() for w, b in zip(self.weights, self.biases))

    def merge_modes(self, l: int) -> tuple[bool, bool]:
        """(positively homogeneous, homogeneous for any sign) for the map after hidden layer ``l``."""
        return self.acts[l].homogeneous, self.acts[l].linear

    def copy(self) -> "Chain":
        return Chain([w.clone() for w in self.weights], [b.clone() for b in self.biases], list(self.acts),
                     [[list(g) for g in layer] for layer in self.groups], self.dtype)


def _flat_modules(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, nn.Sequential):
        return [m for child in model for m in _flat_modules(child)]
    return [model]


def fold_bn_after(w: torch.Tensor, b: torch.Tensor, bn: nn.modules.batchnorm._BatchNorm
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """BN(Wx + b) = diag(s)(Wx + b) + t with s = γ/√(var+eps), t = β − s·mean (Linear or conv weight ``w``)."""
    s, t = _bn_affine(bn)
    return w * s.reshape(-1, *[1] * (w.dim() - 1)), b * s + t


def _bn_affine(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    if bn.running_mean is None:
        raise CompressionError(f"{type(bn).__name__} without running statistics cannot be folded; "
                               "use track_running_stats")
    s = (bn.weight.detach().double() if bn.affine else 1.0) / torch.sqrt(bn.running_var.double() + bn.eps)
    t = (bn.bias.detach().double() if bn.affine else 0.0) - s * bn.running_mean.double()
    return s, t


def extract_chain(model: nn.Module) -> Chain:
    """Read a (nested) ``nn.Sequential`` of Linear/BatchNorm1d/activation/Dropout/Flatten into a :class:`Chain`.

    BatchNorm1d right after a Linear folds into it; after an activation it folds into the next Linear.
    Two Linears with nothing between them get an identity activation.
    """
    ws, bs, acts, pending_act, pending_bn = [], [], [], None, None
    for m in _flat_modules(model):
        if isinstance(m, _SKIPPED):
            continue
        if isinstance(m, nn.Linear):
            if ws:
                acts.append(ActSpec.of(pending_act))
            w = m.weight.detach().double()
            b = m.bias.detach().double() if m.bias is not None else torch.zeros(m.out_features, dtype=torch.float64)
            if pending_bn is not None:
                s, t = pending_bn
                w, b = w * s[None, :], b + w @ t
            ws.append(w.clone())
            bs.append(b.clone())
            pending_act, pending_bn = None, None
        elif isinstance(m, nn.BatchNorm1d) and ws and pending_act is None and pending_bn is None:
            ws[-1], bs[-1] = fold_bn_after(ws[-1], bs[-1], m)
        elif isinstance(m, nn.BatchNorm1d) and pending_act is not None:
            pending_bn = _bn_affine(m)
        elif type(m) in ACT_KINDS and ws and pending_act is None:
            pending_act = m
        else:
            raise CompressionError(f"fde/pruning handle plain MLPs (Linear, BatchNorm1d, activations "
                                   f"{sorted(ACT_KINDS.values())}); cannot place {type(m).__name__}")
    if not ws or pending_act is not None or pending_bn is not None:
        raise CompressionError("model must be a Sequential MLP that ends with an nn.Linear output layer")
    dtype = next(model.parameters()).dtype
    return Chain(ws, bs, acts, [[[i] for i in range(w.shape[0])] for w in ws[:-1]], dtype)


def chain_forward(chain: Chain, x: torch.Tensor, hidden: bool = False) -> torch.Tensor | list[torch.Tensor]:
    """Evaluate the chain in float64; with ``hidden`` return every hidden activation and the output."""
    h = x.reshape(len(x), -1).double()
    states = []
    for l, (w, b) in enumerate(zip(chain.weights, chain.biases)):
        h = h @ w.T + b
        if l < len(chain.acts):
            h = chain.acts[l](h)
        states.append(h)
    return states if hidden else h


def build_sequential(chain: Chain) -> nn.Sequential:
    """A plain ``Flatten → Linear → act → … → Linear`` module with the chain's weights in its dtype."""
    layers: list[nn.Module] = [nn.Flatten()]
    for l, (w, b) in enumerate(zip(chain.weights, chain.biases)):
        lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        layers.append(lin.to(chain.dtype))
        if l < len(chain.acts):
            layers.append(copy.deepcopy(chain.acts[l].module))
    return nn.Sequential(*layers).eval()


def chain_layer_reports(before: Chain, after: Chain, action: str, details: list[dict]) -> list[LayerReport]:
    """One report per Linear of the emitted stack (``rank`` = output width after, ``full_rank`` before)."""
    reports = []
    for l, (wb, wa) in enumerate(zip(before.weights, after.weights)):
        pb, pa = wb.numel() + wb.shape[0], wa.numel() + wa.shape[0]
        changed = wa.shape != wb.shape
        reports.append(LayerReport(f"{2 * l + 1}", "Linear", action if changed else "kept", "", pb, pa, wb.numel(),
                                   wa.numel(), wa.shape[0], wb.shape[0], details[l] if l < len(details) else {}))
    return reports


def mlp_params(in_features: int, widths: Sequence[int], out_features: int) -> int:
    """Closed form for a biased Linear stack: Σ (w_{l−1} + 1)·w_l over in → widths → out."""
    dims = [in_features, *widths, out_features]
    return sum((a + 1) * b for a, b in zip(dims[:-1], dims[1:]))

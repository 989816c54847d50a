"""Small reference architectures used by the demo, the tests and the benchmarks (plain torch modules)."""

from __future__ import annotations

from torch import nn

__all__ = ["mlp", "small_cnn", "ACTIVATIONS"]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "leaky_relu": nn.LeakyReLU, "silu": nn.SiLU, "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "identity": nn.Identity,
}


def mlp(in_features: int, widths: list[int], out_features: int, activation: str = "relu") -> nn.Sequential:
    """Linear+activation stack: ``in → widths[0] → … → widths[-1] → out`` (flattens its input)."""
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = [nn.Flatten()]
    prev = in_features
    for w in widths:
        layers += [nn.Linear(prev, w), act()]
        prev = w
    layers.append(nn.Linear(prev, out_features))
    return nn.Sequential(*layers)


def small_cnn(in_channels: int = 1, widths: tuple[int, ...] = (32, 64, 64), num_classes: int = 10) -> nn.Sequential:
    """Conv-BN-ReLU stages (the second and third stride 2), global average pool, linear head."""
    layers: list[nn.Module] = []
    prev = in_channels
    for i, w in enumerate(widths):
        layers += [nn.Conv2d(prev, w, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                   nn.BatchNorm2d(w), nn.ReLU()]
        prev = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(prev, num_classes)]
    return nn.Sequential(*layers)

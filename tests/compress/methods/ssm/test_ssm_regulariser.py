"""Mathematics of the tail-only Hankel regulariser: Σ_{i>r} σ_i (and its ratio to Σσ) against the exact HSVs,
its gradient (gradcheck; zero along head-only perturbations), the budget allocation, the import paths."""

from __future__ import annotations

import pytest
import torch

from minreal.compress.methods.ssm import (
    RotationSSM,
    SSMClassifier,
    dense_gramians,
    hankel_nuclear_norm,
    hankel_regulariser,
    hankel_singular_values,
    hankel_tail_norm,
    layer_gramians,
    orders_from_budget,
    rotation_gramians,
    tail_energies,
    tail_energy,
    target_orders,
)


def _layer(seed: int, features: int = 2, state: int = 8) -> RotationSSM:
    torch.manual_seed(seed)
    layer = RotationSSM(features, state).double()
    with torch.no_grad():  # spread ρ so that the HSVs are distinct and decay
        layer.rho_raw.copy_(torch.atanh(2 * torch.linspace(0.3, 0.95, state // 2, dtype=torch.float64) - 1))
    return layer


def _reg_of_params(order: int, relative: bool):
    def reg(rho_raw, alpha_raw, b, c):
        rho, alpha = 0.5 * (1 + torch.tanh(rho_raw)), 0.5 * torch.pi * (1 + torch.tanh(alpha_raw))
        return hankel_tail_norm(*rotation_gramians(rho, alpha, b, c), order, jitter=0.0, relative=relative)
    return reg


@pytest.mark.parametrize("relative", [False, True])
def test_tail_norm_gradcheck(relative: bool) -> None:
    layer = _layer(3, state=6)
    hsv = hankel_singular_values(*dense_gramians(layer.state_space()))
    assert (hsv[:-1] - hsv[1:]).min() > 1e-4 * hsv[0]  # distinct singular values: the gradient exists
    args = tuple(t.detach().clone().requires_grad_(True) for t in (layer.rho_raw, layer.alpha_raw, layer.b, layer.c))
    assert torch.autograd.gradcheck(_reg_of_params(2, relative), args, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("order", [0, 1, 3, 7, 8, 11])
def test_tail_norm_equals_tail_of_exact_hsvs(order: int) -> None:
    layer = _layer(4)
    with torch.no_grad():
        p, q = rotation_gramians(layer.rho, layer.alpha, layer.b, layer.c)
    hsv = hankel_singular_values(*dense_gramians(layer.state_space()))
    tol = 1e-10 * float(hsv[0])  # the eigvalsh(σ²) reference is accurate to ~ε·σ_1 in absolute terms
    tail = hankel_tail_norm(p, q, order, jitter=0.0)
    assert float(tail) == pytest.approx(float(hsv[order:].sum()), rel=1e-8, abs=tol)
    ratio = float(hankel_tail_norm(p, q, order, jitter=0.0, relative=True))
    assert ratio == pytest.approx(tail_energy(hsv, order), rel=1e-8, abs=tol / float(hsv.sum()))
    if order >= 8:  # order ≥ n: nothing beyond r, exactly zero
        assert float(tail) == 0.0 and ratio == 0.0
    if order == 0:  # no head: the full nuclear norm
        assert float(tail) == pytest.approx(float(hankel_nuclear_norm(p, q, jitter=0.0)), rel=1e-12)


def test_tail_norm_vanishes_for_a_system_of_order_at_most_r() -> None:
    layer = _layer(5, state=8)
    with torch.no_grad():
        layer.b[4:] = 0.0  # the last two rotation blocks are unreachable: minimal order 4
        p, q = rotation_gramians(layer.rho, layer.alpha, layer.b, layer.c)
    full = float(hankel_nuclear_norm(p, q))
    # Only the Cholesky jitter ε = 1e-9·mean diag keeps the dropped σ off zero (σ ~ sqrt(ε) relative).
    assert float(hankel_tail_norm(p, q, 4)) < 1e-3 * full
    assert float(hankel_tail_norm(p, q, 2)) > 0.05 * full


def test_head_singular_values_are_not_penalised() -> None:
    g = torch.Generator().manual_seed(0)
    sigma = torch.tensor([3.0, 2.0, 1.5, 0.7, 0.4, 0.1], dtype=torch.float64)
    t, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    p = (t @ torch.diag(sigma) @ t.T).requires_grad_(True)  # balanced up to a rotation: P = Q = T Σ Tᵀ
    q = (t @ torch.diag(sigma) @ t.T).requires_grad_(True)
    head = t @ torch.diag(torch.tensor([1.0, -0.5, 2.0, 0, 0, 0], dtype=torch.float64)) @ t.T  # moves σ_1..σ_3 only
    directional = lambda f: float(sum((gr * head).sum() for gr in torch.autograd.grad(f(p, q), (p, q))))  # noqa: E731
    assert abs(directional(lambda a, b: hankel_tail_norm(a, b, 3, jitter=0.0))) < 1e-12
    assert directional(lambda a, b: hankel_nuclear_norm(a, b, jitter=0.0)) > 0.1
    tail_only = lambda a, b: hankel_tail_norm(a, b, 3, jitter=0.0)  # noqa: E731
    assert float(tail_only(p, q).detach()) == pytest.approx(float(sigma[3:].sum()), rel=1e-12)


def _model(seed: int = 0) -> SSMClassifier:
    torch.manual_seed(seed)
    return SSMClassifier(1, 4, 10, 2, 3)


def _exact_hsvs(model: SSMClassifier) -> dict[str, torch.Tensor]:
    layers = {n: m for n, m in model.named_modules() if isinstance(m, RotationSSM)}
    return {n: hankel_singular_values(*layer_gramians(m)) for n, m in layers.items()}


def _value(model: SSMClassifier, *args, **kwargs) -> float:
    return float(hankel_regulariser(model, *args, **kwargs).detach())


def test_model_regulariser_full_tail_and_budget_match_exact_hsvs() -> None:
    model = _model()
    hsvs = _exact_hsvs(model)
    assert list(hsvs) == ["blocks.0.ssm", "blocks.1.ssm"]
    full = _value(model, 0.5)
    assert full == pytest.approx(0.5 * sum(float(h.sum()) for h in hsvs.values()), rel=1e-5)
    tail = _value(model, 0.5, target_order=4)
    assert tail == pytest.approx(0.5 * sum(float(h[4:].sum()) for h in hsvs.values()), rel=1e-5)
    per_layer = {"blocks.0.ssm": 2, "blocks.1.ssm": 6}
    ratio = _value(model, 1.0, target_order=per_layer, relative=True)
    assert ratio == pytest.approx(sum(tail_energy(h, per_layer[n]) for n, h in hsvs.items()), rel=1e-5)
    orders = orders_from_budget(hsvs, 9)
    budget = _value(model, 1.0, state_budget=9)
    assert budget == pytest.approx(sum(float(h[orders[n]:].sum()) for n, h in hsvs.items()), rel=1e-5)
    measured, used = tail_energies(model, state_budget=9)
    assert used == orders and measured == pytest.approx({n: tail_energy(h, orders[n]) for n, h in hsvs.items()})


def test_per_layer_weights_weigh_each_layer_tail() -> None:
    model = _model()
    hsvs = _exact_hsvs(model)
    weights = {"blocks.0.ssm": 0.25, "blocks.1.ssm": 3.0}
    got = _value(model, weights, target_order=3)
    assert got == pytest.approx(sum(w * float(hsvs[n][3:].sum()) for n, w in weights.items()), rel=1e-5)
    only_second = _value(model, {"blocks.0.ssm": 0.0, "blocks.1.ssm": 1.0}, target_order=3)
    assert only_second == pytest.approx(float(hsvs["blocks.1.ssm"][3:].sum()), rel=1e-5)
    with pytest.raises(ValueError, match=r"\['blocks.1.ssm'\]"):
        hankel_regulariser(model, {"blocks.0.ssm": 1.0}, target_order=3)


def test_target_orders_reject_ambiguous_or_incomplete_targets() -> None:
    hsvs = {"a": torch.ones(4), "b": torch.ones(4)}
    assert target_orders(hsvs) is None and target_orders(hsvs, 3) == {"a": 3, "b": 3}
    with pytest.raises(ValueError, match="not both"):
        target_orders(hsvs, 3, 5)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        target_orders(hsvs, {"a": 2})
    with pytest.raises(ValueError, match="need a target"):
        tail_energies(_model())


def test_tail_descent_lowers_the_tail() -> None:
    model = _model(1)
    before = tail_energies(model, target_order=4)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(10):
        opt.zero_grad()
        hankel_regulariser(model, 1.0, target_order=4, relative=True).backward()
        opt.step()
    after = tail_energies(model, target_order=4)[0]
    assert all(after[n] < before[n] for n in before)


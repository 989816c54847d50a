"""``ssm``: balanced truncation of state-space (SSM) layers — the layers, their Gramians and Hankel singular values,
balanced truncation, modal forms, and the method."""

from . import mac_rules as _mac_rules  # noqa: F401  (registers the SSM MAC rules)
from .balance import (BalancedResult, balanced_truncation, order_from_energy, order_from_trunc,
                      orders_from_budget, tail_energy, truncation_bound)
from .gramians import (dense_gramians, hankel_nuclear_norm, hankel_singular_values, hankel_svdvals, hankel_tail_norm,
                       rotation_gramians, singular_value_tail)
from .layers import SSM_LAYERS, DenseSSM, DiagonalSSM, ModalSSM, RotationSSM, SchurSSM
from .modal import ModalForm, real_modal_form, real_schur_form
from .classifier import SSMBlock, SSMClassifier, hankel_regulariser, rotation_layers, tail_energies, target_orders
from .method import SPEC, SSMConfig, demo_case, find_ssm_layers, layer_gramians, ssm_compress
from .system import StateSpace, change_basis, impulse_response, random_stable_system, simulate
from .training import (HankelRegularisation, SSMEpoch, SSMTrainResult, SSMTrainSpec, controlled_weight,
                       scheduled_weight, train_ssm_classifier)

__all__ = ["SPEC", "SSMConfig", "demo_case", "find_ssm_layers", "layer_gramians", "ssm_compress",
           "BalancedResult", "balanced_truncation", "order_from_energy", "order_from_trunc",
           "orders_from_budget", "tail_energy", "truncation_bound", "dense_gramians", "hankel_nuclear_norm",
           "hankel_singular_values", "hankel_svdvals", "hankel_tail_norm", "singular_value_tail", "rotation_gramians",
           "SSM_LAYERS", "DenseSSM", "DiagonalSSM", "ModalSSM", "RotationSSM", "SchurSSM", "ModalForm",
           "real_modal_form", "real_schur_form", "SSMBlock",
           "SSMClassifier", "hankel_regulariser", "rotation_layers", "tail_energies", "target_orders", "StateSpace",
           "change_basis", "impulse_response", "random_stable_system", "simulate", "HankelRegularisation", "SSMEpoch",
           "SSMTrainResult", "SSMTrainSpec", "controlled_weight", "scheduled_weight", "train_ssm_classifier"]

"""``ssm``: balanced truncation of state-space (SSM) layers — the layers, their Gramians and Hankel singular values,
balanced truncation, modal forms, and the method (importing the layers registers their MAC rules)."""

from ...core.lazy import lazy_exports
from ...core.spec import MethodSpec
from .config import SSMConfig

__all__ = ["SPEC", "SSMConfig", "demo_case", "find_ssm_layers", "layer_gramians", "ssm_compress",
           "BalancedResult", "balanced_truncation", "order_from_energy", "order_from_trunc",
           "orders_from_budget", "tail_energy", "truncation_bound", "dense_gramians", "hankel_nuclear_norm",
           "hankel_singular_values", "hankel_svdvals", "hankel_tail_norm", "singular_value_tail", "rotation_gramians",
           "SSM_LAYERS", "DenseSSM", "DiagonalSSM", "ModalSSM", "RotationSSM", "SchurSSM", "ModalForm",
           "real_modal_form", "real_schur_form", "SSMBlock",
           "SSMClassifier", "hankel_regulariser", "rotation_layers", "tail_energies", "target_orders", "StateSpace",
           "change_basis", "impulse_response", "random_stable_system", "simulate", "HankelRegularisation", "SSMEpoch",
           "SSMTrainResult", "SSMTrainSpec", "controlled_weight", "scheduled_weight", "train_ssm_classifier"]

_METHOD = "minreal.compress.methods.ssm.method"
SPEC = MethodSpec("ssm", "balanced truncation + real modal form of SSM layers (HSV-regularised)", SSMConfig,
                  f"{_METHOD}:ssm_compress", demo_case=f"{_METHOD}:demo_case", report_fields=("bounds",),
                  smoke_case="minreal.compress.methods.ssm.smoke:smoke_case")

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("BalancedResult", "balanced_truncation", "order_from_energy", "order_from_trunc",
                     "orders_from_budget", "tail_energy", "truncation_bound"), ".balance"),
    **dict.fromkeys(("dense_gramians", "hankel_nuclear_norm", "hankel_singular_values", "hankel_svdvals",
                     "hankel_tail_norm", "rotation_gramians", "singular_value_tail"), ".gramians"),
    **dict.fromkeys(("SSM_LAYERS", "DenseSSM", "DiagonalSSM", "ModalSSM", "RotationSSM", "SchurSSM"), ".layers"),
    **dict.fromkeys(("ModalForm", "real_modal_form", "real_schur_form"), ".modal"),
    **dict.fromkeys(("SSMBlock", "SSMClassifier", "hankel_regulariser", "rotation_layers", "tail_energies",
                     "target_orders"), ".classifier"),
    **dict.fromkeys(("demo_case", "find_ssm_layers", "layer_gramians", "ssm_compress"), ".method"),
    **dict.fromkeys(("StateSpace", "change_basis", "impulse_response", "random_stable_system", "simulate"), ".system"),
    **dict.fromkeys(("HankelRegularisation", "SSMEpoch", "SSMTrainResult", "SSMTrainSpec", "controlled_weight",
                     "scheduled_weight", "train_ssm_classifier"), ".training")})


"""What several methods share: statistics through hooks, linear algebra, surgery, cost counting, allocators,
training/distillation/fine-tuning, caching, data, evaluation, progress, errors, reports and the
:class:`~minreal.compress.core.spec.MethodSpec` every method package exports. Nothing here imports a method."""

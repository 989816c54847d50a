"""minreal: make trained PyTorch models smaller and faster by structure, export them to ONNX and benchmark them.

Import names: :mod:`minreal.compress` (PyTorch only), :mod:`minreal.runtime_bench` (ONNX Runtime only),
:mod:`minreal.export` (where the two meet), :mod:`minreal.app` (the command line and the pipelines on top) and
:mod:`minreal.facts` (standard-library facts every layer shares). The first three live in the repository's root
folders of the same names; ``setup.py`` maps them under this package.
"""

__all__: list[str] = []

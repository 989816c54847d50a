"""The ``minreal`` commands, one module each; :mod:`minreal.app.cli` registers them on the ``minreal`` group."""

"""Built-in compression methods: one package per method, each exporting one ``SPEC`` (a
:class:`~minreal.compress.core.spec.MethodSpec`). The registry finds them by iterating this package; nothing here
lists them."""

"""The command line's spelling of the library's fields: the one table from a field or parameter that a library error
names (:class:`minreal.facts.FieldError`) to the flag that sets it, and the rewrite that puts the flags in place of
the fields in an error's message when the command line shows it (:func:`minreal.app.errors.invoke`).

A field is spelled by its owner, as the message names it (`` `RecoveryConfig.epochs` ``, `` `check_report.plan` ``;
a bare `` `mac_ratio` `` is a method's config field or a parameter whose flag is its own name): a field ``foo_bar``
is ``--foo-bar``, with the owner's prefix where it has one (:data:`OWNER_PREFIX`), unless :data:`FLAG_NAMES` says
otherwise. A library message that names the flag too, for a test that pins the flag's text (``PINNED`` in
``tests/app/test_field_flags.py``), names the field first, in one of two forms the rewrite turns into the flag alone:
`` `layer_mac_ratio` (--layer-mac-ratio) must lie in (0, 1] `` (the flag, and what follows it inside the
parentheses, in place of the mention), or a lead `` `exclude`: --exclude layer9.0: no residual block ... `` (the
mentions before a colon dropped, where the rest of the message names each one's flag). In either form the mention
may carry the value the Python call gave it (`` `quant_mode`='dynamic': --quant-mode dynamic cannot ... ``,
`` `width_min`=16 (--width-min 16: ...) ``), which the flag's text says again.
``tests/app/test_field_flags.py`` checks that every field a library error names is spelled as a flag some command
declares.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from minreal.compress.core.options import flag_of
from minreal.facts import FieldError

__all__ = ["OWNER_PREFIX", "FLAG_NAMES", "flag_for", "flag_spelled", "fields_spelled"]

#: Owners whose fields the command line spells with a prefix (``RecoveryConfig.epochs`` is ``--recover-epochs``:
#: :func:`minreal.app.options.recovery_config`).
OWNER_PREFIX = MappingProxyType({"RecoveryConfig": "recover_"})
#: ``(owner, field)`` -> its flag, where that is not the field's (prefixed) name.
FLAG_NAMES = MappingProxyType({
    ("RecoveryConfig", "freeze_batchnorm"): "--recover-freeze-bn",
    # `minreal check --paired` builds the decision plan (minreal.app.commands.check)
    ("check_report", "plan"): "--paired",
    # a TensorRT profile is a table, which only the --provider-config file holds (not --provider-option)
    ("BenchConfig", "provider_settings"): "--provider-config",
    ("BenchConfig", "intra_op_threads"): "--threads",
    # `minreal check --max-size` takes KiB, as check_report's max_size_kb does
    ("check_report", "max_size_kb"): "--max-size",
})


def flag_for(owner: str, name: str) -> str:
    """The flag of field ``name`` of ``owner`` (a config class or a function; ``""``: a bare mention)."""
    return FLAG_NAMES.get((owner, name)) or flag_of(OWNER_PREFIX.get(owner, "") + name)


def flag_spelled(exc: BaseException, text: str | None = None) -> str:
    """``text`` (``str(exc)`` when None) with the command line's flag in place of each field that ``exc`` names (its
    ``fields``, :class:`minreal.facts.FieldError`): :func:`fields_spelled`."""
    return fields_spelled(str(exc) if text is None else text, exc.fields if isinstance(exc, FieldError) else ())


def fields_spelled(text: str, fields: tuple[str, ...]) -> str:
    """``text`` with the command line's flag in place of each backticked mention of one of ``fields``, bare or with
    its owner (`` `mac_ratio` `` and `` `DepthConfig.mac_ratio` `` -> ``--mac-ratio``, `` `RecoveryConfig.epochs` ``
    -> ``--recover-epochs``), the flag named once where the message names it beside the field (the module's two
    forms: `` `f` (--f ...) `` -> ``--f ...``, and a lead `` `f`: `` dropped before a text that names ``--f``).
    Nothing else in the text changes."""
    if not fields:
        return text
    name = r"`(?:(\w+)\.)?(" + "|".join(re.escape(f) for f in fields) + r")`"
    value = r"=('[^']*'|[\w.+-]+)"  # `f`='static': the Python value the mention was given

    def lead(m: re.Match[str]) -> str:  # `a`=1 and `b`: ... --a 1 ... --b  ->  ... --a 1 ... --b
        flags = [flag_for(owner, f) for owner, f in re.findall(name, m[1])]
        return "" if all(_names(text[m.end():], f) for f in flags) else m[0]

    def beside(m: re.Match[str]) -> str:  # `a`=1 (--a 1)  ->  --a 1
        flag, given, inside = flag_for(m[1] or "", m[2]), m[3], m[4]
        if inside is not None and _names(inside, flag, at_start=True):
            return inside
        shown = "" if given is None else " " + given.strip("'")
        return flag + shown + ("" if inside is None else f" ({inside})")

    text = re.sub(rf"((?:{name}(?:{value})?(?:, | and | or )?)+): ", lead, text)
    return re.sub(rf"{name}(?:{value})?(?: \(([^()]*)\))?", beside, text)


def _names(text: str, flag: str, at_start: bool = False) -> bool:
    """Whether ``text`` names ``flag`` as a whole flag (not ``--max-size`` inside ``--max-size-ratio``), at its start
    when ``at_start``."""
    pattern = ("^" if at_start else r"(?<![\w-])") + re.escape(flag) + r"(?![\w-])"
    return re.search(pattern, text) is not None

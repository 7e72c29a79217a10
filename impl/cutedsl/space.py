"""The configuration space of the CuTe DSL kernels and policies, generated from their own fields.

Every static configuration (:mod:`.config`) and the dispatch policy (:mod:`.host.policy`)
declare, beside their fields, the values worth compiling or timing: ``SWEEP`` maps a field,
or a group of fields that only go together (a layout and the alignments it allows, a block
size and the lookup runs it allows), to its values. :func:`neighbours` generates from a base
the base itself and every configuration that differs from it in one group; a field holding a
nested configuration takes the nested class's own neighbours too. One pruning rule: a
configuration that its class's validation rejects is left out, and so is a duplicate.

The PTX list (:mod:`.ptx`) is the neighbours of every kernel path's production
configurations; the benchmarks' tuner (``bench/cutedsl_tune.py``) the neighbours of the
default policy.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace


def _changes(base) -> list[dict]:
    """Every one-group change of ``base``: ``{field: value, ...}``."""
    changes = []
    for group, values in getattr(type(base), "SWEEP", {}).items():
        names = group if isinstance(group, tuple) else (group,)
        for value in values:
            changes.append(dict(zip(names, value if isinstance(group, tuple) else (value,))))
    for f in fields(base):  # nested configurations move through their own neighbours
        nested = getattr(base, f.name)
        if is_dataclass(nested) and hasattr(type(nested), "SWEEP"):
            changes.extend({f.name: other} for other in neighbours(nested)[1:])
    return changes


def neighbours(base) -> list:
    """``base``, then every valid configuration one field group away from it, without duplicates."""
    seen = {base: None}
    for change in _changes(base):
        try:
            seen.setdefault(replace(base, **change))
        except ValueError:  # the class's validation rejects this combination
            continue
    return list(seen)

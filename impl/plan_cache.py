"""The launch plans of an implementation, by argument-layout key (shared by both kernel families).

A plan is everything a call decides before its launches; it depends only on the arguments'
layout (SPEC §9's dtypes, shapes, strides, devices, base alignments and scalars), so it is
built once per layout and token count and found again by a key of tensor metadata.
"""

from __future__ import annotations

PLANS_MAX = 8192  # launch plans remembered per implementation (one per layout and token count)


class PlanCache(dict):
    """Launch plans by argument-layout key; cleared when it reaches :data:`PLANS_MAX` entries."""

    def put(self, key, plan):
        if key is not None:
            if len(self) >= PLANS_MAX:
                self.clear()
            self[key] = plan
        return plan

    def find(self, make_key, *arguments) -> tuple:
        """``(key, plan)`` for ``make_key(*arguments)``: ``plan`` None on a miss; both None when an
        argument is not a tensor or not hashable (AttributeError, TypeError), so that the call is
        validated the long way, which rejects it by name."""
        try:
            key = make_key(*arguments)
            return key, self.get(key)
        except (AttributeError, TypeError):
            return None, None

    def find_key(self, key) -> tuple:
        """``(key, plan)`` for a key already built (None: a call that validates the long way), as
        :meth:`find` gives them; both None for an unhashable argument."""
        try:
            return key, None if key is None else self.get(key)
        except TypeError:
            return None, None

    def lookup(self, key, build):
        """The plan of ``key``, built by ``build()`` on a miss and always for ``key = None`` (calls that
        validate the long way: debug calls, calls with an argument the key leaves out); an unhashable
        argument also validates the long way. A plan may be ``None``: a call that launches nothing."""
        try:
            plan = False if key is None else self.get(key, False)
        except TypeError:
            key, plan = None, False
        if plan is False:
            plan = self.put(key, build())
        return plan

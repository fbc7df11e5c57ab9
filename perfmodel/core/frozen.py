"""Read-only containers for records that are shared (a loaded profile is one object for every caller)."""

from __future__ import annotations

import copy


class FrozenDict(dict):
    """A dict that refuses changes; ``dict(x)`` or ``copy.deepcopy(x)`` gives a mutable plain copy.

    A subclass of dict so that JSON, numpy and ``isinstance(x, dict)`` see plain data.
    """

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("this mapping is read-only: build a new one (dict(x), dataclasses.replace)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self):
        return dict(self)

    def __deepcopy__(self, memo):
        return {copy.deepcopy(k, memo): copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self):
        return (dict, (dict(self),))

    def __hash__(self):  # dataclass(frozen=True) fields stay hashable only by identity
        return id(self)


def freeze(obj):
    """``obj`` with every dict inside made a FrozenDict and every list a tuple."""
    if isinstance(obj, dict):
        return FrozenDict({k: freeze(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return tuple(freeze(v) for v in obj)
    return obj

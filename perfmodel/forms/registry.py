"""The registry of named closed forms, built explicitly from the modules that define them.

A Profile stores, for each op class or collective, the *name* of a closed form
and its fitted parameters. Loading a profile looks the name up here: nothing
from a file is ever executed. The registry is the union of the ``FORMS`` tuples
of :mod:`perfmodel.forms.compute`, :mod:`perfmodel.forms.attention` and :mod:`perfmodel.forms.comm`; importing a
module never adds to it. Each form carries its twin on Python floats
(:mod:`perfmodel.forms.scalar`), which ``Form.evaluate`` uses for one-number variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from perfmodel.core.errors import unknown_name
from perfmodel.forms import attention, comm, compute
from perfmodel.forms.base import Form
from perfmodel.forms.scalar import SCALAR_FNS


def _registry(*groups: Iterable[Form]) -> Mapping[str, Form]:
    forms: dict[str, Form] = {}
    for group in groups:
        for form in group:
            if form.name in forms:
                raise ValueError(f"form {form.name!r} defined twice")
            forms[form.name] = dataclasses.replace(form, scalar_fn=SCALAR_FNS.get(form.name, form.scalar_fn))
    return MappingProxyType(forms)


FORMS: Mapping[str, Form] = _registry(compute.FORMS, attention.FORMS, comm.FORMS)
COMM_FORMS: tuple[str, ...] = tuple(f.name for f in comm.FORMS)


def get_form(name: str) -> Form:
    if name not in FORMS:
        raise unknown_name("closed form", name, FORMS)
    return FORMS[name]

"""The dispatch registry: the layout rule and the error for unsupported ops."""

from __future__ import annotations

import pytest
import torch

import nestbatch
from nestbatch import Layout
from nestbatch.ops import registry


def test_unknown_op_names_it_and_the_way_out():
    x = nestbatch.nested([torch.ones(2)])
    with pytest.raises(TypeError, match=r"torch\.kron is not supported.*\.padded\(\).*\.values"):
        torch.kron(x, x)


def test_materialized_layout_is_used():
    x = nestbatch.nested([torch.ones(2), torch.ones(3)], layout=Layout.PADDED)
    y = x.exp()  # elementwise supports padded: no conversion to packed
    assert x.materialized_layouts == (Layout.PADDED,)
    assert y.layout is Layout.PADDED
    z = nestbatch.nested([torch.ones(2)], layout=Layout.LIST).exp()
    assert z.layout is Layout.PACKED  # converted to the preferred one


def test_register_and_choose():
    seen = []

    @registry.register(torch.special.entr, layouts=(Layout.PACKED, Layout.PADDED),
                       prefer=Layout.PADDED)
    def _entr(layout, func, args, kwargs):
        seen.append(layout)
        return args[0].map_values(func)

    try:
        x = nestbatch.nested([torch.ones(2)])
        torch.special.entr(x)
        assert seen == [Layout.PACKED]
        torch.special.entr(nestbatch.nested([torch.ones(2)], layout=Layout.LIST))
        assert seen[-1] is Layout.PADDED
        assert torch.special.entr in registry.registered_functions()
    finally:
        registry._REGISTRY.pop(torch.special.entr)
    with pytest.raises(ValueError, match="prefer"):
        registry.register(torch.exp, layouts=(Layout.PACKED,), prefer=Layout.PADDED)

"""Conversions between the layouts (foreign formats are in :mod:`nestbatch.compat`).

Layout conversions (every pair among list, packed and padded, both directions) take and return
layout objects; they are vectorized, differentiable, and keep device and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

from nestbatch.checks import check_filler, check_padding_side
from nestbatch.conversions.list_packed import list_to_packed, packed_to_list
from nestbatch.conversions.list_padded import list_to_padded, padded_to_list
from nestbatch.conversions.packed_padded import (
    packed_to_padded,
    padded_to_packed,
    refill_padding,
)
from nestbatch.conversions.padding_side import to_side
from nestbatch.layouts import Packed, Padded, RaggedLayout, TensorList


def to_packed(layout: RaggedLayout) -> Packed:
    """Any layout as :class:`Packed`."""
    if isinstance(layout, Packed):
        return layout
    if isinstance(layout, Padded):
        right = layout if layout.padding_side == "right" else to_side(layout, "right")
        return padded_to_packed(right)
    return list_to_packed(layout)


def to_padded(
    layout: RaggedLayout,
    padding_value: float = 0.0,
    max_shape: Sequence[int | None] | None = None,
    padding_side: str = "right",
) -> Padded:
    """Any layout as :class:`Padded` with ``padding_value`` in the padded slots, on
    ``padding_side`` (``"left"``: one ragged dim, see :mod:`nestbatch.conversions.padding_side`).

    Raises
    ------
    TypeError, ValueError
        For a ``padding_value`` the layout's dtype cannot hold (``-1`` for ``uint8``, ``2.5``
        for an integer dtype, ``1e10`` for ``float16``), naming it, the dtype and the value.
    """
    if not (type(padding_value) is float and padding_value == 0.0):  # 0 fits every dtype
        padding_value = check_filler(padding_value, layout.dtype)
    if type(layout) is Packed and padding_side == "right":
        return packed_to_padded(layout, padding_value, max_shape)  # the common case, first
    if padding_side != "right":  # (right padding suits every batch)
        check_padding_side(padding_side, layout.partition.num_ragged_dims)
    if isinstance(layout, Padded):
        layout = to_side(layout, "right")  # the conversions are written for right padding
        if max_shape is None:
            return to_side(refill_padding(layout, padding_value), padding_side)
        layout = padded_to_packed(layout)
    if isinstance(layout, Packed):
        padded = packed_to_padded(layout, padding_value, max_shape)
    else:
        padded = list_to_padded(layout, padding_value, max_shape)
    return to_side(padded, padding_side)


def to_list(layout: RaggedLayout) -> TensorList:
    """Any layout as :class:`TensorList` (views into the source's storage)."""
    if isinstance(layout, TensorList):
        return layout
    if isinstance(layout, Packed):
        return packed_to_list(layout)
    return padded_to_list(layout)  # (views, whichever side the padding is on)


__all__ = [
    "list_to_packed",
    "list_to_padded",
    "packed_to_list",
    "packed_to_padded",
    "padded_to_list",
    "padded_to_packed",
    "refill_padding",
    "to_list",
    "to_packed",
    "to_padded",
]

"""`NestedBatch`: a ragged batch in whichever layout it was built, converted lazily to the others.

A :class:`NestedBatch` holds one :class:`~nestbatch.layouts.RowPartition` (the per-sample
shapes) and a cache of layout objects that share it. Asking for another layout converts once and
caches the result; results of ops are new batches, and nothing mutates a cached layout.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nestbatch import conversions as convert
from nestbatch.checks import (
    as_index_tensor,
    as_offsets,
    check_batch_indices,
    check_count,
    check_device_lengths,
    check_host_lengths_fit,
    check_host_offsets,
    check_integer_tensor,
    check_lengths_total,
    check_offsets_on_device,
    check_one_of,
    check_padding_side,
    check_prefix_mask,
    check_ragged_dim,
    check_tensor,
    check_values,
    checked_host_sizes,
    host_ints,
    host_tensor_sizes,
    normalize_dim,
    read_device_values,
)
from nestbatch.errors import NestedValueError
from nestbatch.layouts import Layout, Packed, Padded, RaggedLayout, RowPartition, TensorList
from nestbatch.layouts.padded import filler_key
from nestbatch.layouts.sizes import NestedSize, RaggedSize
from nestbatch.tensor_methods import TensorMethods


class PaddedKey(NamedTuple):
    """The cache key of a padded layout: its filler (as :func:`filler_key` spells it, or None
    when unspecified) and its padding side."""

    filler: Any
    side: str = "right"


#: The key of the default padded layout: zeros on the right.
_ZERO_FILLER = filler_key(0.0)
_RIGHT_ZEROS = PaddedKey(_ZERO_FILLER, "right")
_RIGHT_UNKNOWN = PaddedKey(None, "right")  # (a batch from padded data of unknown filler)

_MAX_SAMPLES = 2**31 - 1  # the kernels index samples with int32 grids

# What ``__torch_function__`` calls: the op registry (a layer above this one) plugs its
# dispatcher in at import, so this module does not import it.
_DISPATCH: list[Callable[..., Any]] = []


def plug_dispatcher(dispatch: Callable[..., Any]) -> None:
    """Make ``dispatch(func, types, args, kwargs)`` what ``NestedBatch.__torch_function__`` runs
    (the op registry's, :func:`nestbatch.ops.registry.dispatch`)."""
    _DISPATCH[:] = [dispatch]


class NestedBatch(TensorMethods):
    """A batch of ``B`` samples of shapes ``(*ragged_shape_i, *feature_shape)``.

    Build one with :func:`nestbatch.nested`, :func:`nestbatch.as_nested` or the ``from_*``
    constructors; read it in any layout with :meth:`packed`, :meth:`padded` and :meth:`tolist`.

    Parameters
    ----------
    layout : RaggedLayout
        The layout the batch is stored in (a :class:`~nestbatch.layouts.Packed`,
        :class:`~nestbatch.layouts.Padded` or :class:`~nestbatch.layouts.TensorList`).
    ragged_dim : int, default 1
        Logical position of the ragged dim, for a batch with one ragged dim (as
        ``torch.nested``'s jagged ``_ragged_idx``): ``x.transpose(1, 2)`` of samples
        ``(L_i, H, D)`` presents them as ``(H, L_i, D)`` with ``ragged_dim=2``. Storage never
        moves: every layout keeps the ragged dim first in each sample, and the stored feature
        dims are the remaining logical dims in order.

    Notes
    -----
    Host-side sizes are kept when known (a batch built from a list, or with ``max_len=``), so
    conversions do not synchronize with the device. When sizes exist only on the device, the
    first conversion that needs them (to a padded shape, a packed total or a list) reads them once.

    Every conversion is differentiable: gradients flow from any layout back to the one the batch
    was built from.
    """

    def __init__(self, layout: RaggedLayout, ragged_dim: int = 1) -> None:
        if not isinstance(layout, RaggedLayout):
            raise TypeError(
                f"layout must be a Packed, Padded or TensorList, got {type(layout).__name__}"
            )
        ragged_dim = check_ragged_dim(ragged_dim, layout.num_ragged_dims, len(layout.feature_shape))
        self._init(layout, ragged_dim)

    @classmethod
    def trusted(cls, layout: RaggedLayout, ragged_dim: int = 1) -> NestedBatch:
        """A batch over ``layout`` with no checks: for nestbatch's ops, which build the layout
        from a valid batch (the public constructor checks ``ragged_dim`` against it)."""
        batch = cls.__new__(cls)
        batch._init(layout, ragged_dim)
        return batch

    def _init(self, layout: RaggedLayout, ragged_dim: int) -> None:
        # Every field, set in this one place.
        self._ragged_dim = ragged_dim
        self._primary = layout
        self._partition = layout.partition
        self._cache: dict[Any, RaggedLayout] = {}
        # The stored tensor and every cached conversion's, with its version counter (torch's
        # ``_version``) as the conversion was cached; key None for the stored one. Empty while
        # nothing but the primary layout is cached, and for layouts not compared. See _fresh.
        self._versions: dict[Any, tuple[Tensor, int]] = {}
        # The batch whose cached packed rows this one's stored tensor views (a view op's result
        # over a conversion), brought up to date before this one reads: see _fresh.
        self._base_batch: NestedBatch | None = None
        # The rows of the last packed conversion not cached because the stored data needs a
        # gradient (held weakly), and the conversions a view op's result or ``to(layout)`` holds
        # since, each with its version counter as it was handed out: compared and written back
        # as cached ones are (see _watch).
        self._unkept: weakref.ref | None = None
        self._watched: dict[int, tuple[RaggedLayout | Tensor, int]] = {}
        # The batches made of this one's layouts (view ops' results over its rows, to(layout)),
        # held weakly: freshened before this one compares its own (their writes reach it).
        self._derived: list[weakref.ref] = []
        self._freshening = False
        self._remember(layout)

    # ============================================================================ constructors
    @classmethod
    def from_list(
        cls,
        tensors: Sequence[Tensor],
        num_ragged_dims: int = 1,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> NestedBatch:
        """Batch of the given samples, kept as a list (no copy unless converting).

        Parameters
        ----------
        tensors : sequence of Tensor
            Samples of shapes ``(*ragged_shape_i, *feature_shape)``, same number of dims.
        num_ragged_dims : int, default 1
            How many leading dims are ragged.
        dtype, device : optional
            Convert every sample; required if the samples' dtypes or devices differ.
        """
        return cls.trusted(TensorList(tensors, num_ragged_dims, dtype=dtype, device=device))

    @classmethod
    def from_lengths(
        cls,
        values: Tensor,
        lengths: Tensor | Sequence[int],
        *,
        max_len: int | None = None,
        validate: bool = True,
    ) -> NestedBatch:
        """Batch from packed ``values (total, *feature)`` and ``lengths (B,)`` (TF row_lengths).

        Parameters
        ----------
        values : Tensor
            ``(total, *feature)``, shared.
        lengths : sequence of int or Tensor
            A Python sequence is kept on the host and checked there (no sync ever); its
            offsets are copied to the device once, asynchronously, as the batch is built, so
            that ``torch.compile`` reads the sizes as a tensor of dynamic length rather than
            specializing on each length. So is a 1-d integer tensor in host memory of up to
            :data:`~nestbatch.checks.HOST_TENSOR_SIZES` sizes (read without a sync); other
            tensors stay where they are.
        max_len : int, optional
            The padded length: at least the longest sample (checked), and the width of
            :meth:`padded` (saves reading the largest device length later).
        validate : bool, default True
            Check the lengths against ``values``: on the host for host lengths; for a device
            tensor this reads the device once.

        Raises
        ------
        TypeError, ValueError
            For lengths that are not non-negative integers, do not add up to ``len(values)``,
            or exceed ``max_len``.
        """
        check_values(values)
        max_len = None if max_len is None else check_count(max_len, "max_len")
        lengths = host_tensor_sizes(lengths)  # (a host tensor: read as a sequence)
        if not isinstance(lengths, Tensor):
            host = checked_host_sizes(lengths, "lengths")
            check_lengths_total(host.total, host.largest, values.shape[0], max_len)
            partition = RowPartition.from_host_sizes(
                host, values.device, host.largest if max_len is None else max_len)
            return cls.trusted(Packed.trusted(values, partition))
        lengths = as_index_tensor(lengths, "lengths", values.device)
        partition = RowPartition.from_lengths(lengths, max_len=max_len)
        if validate:
            check_device_lengths(lengths, values.shape[0], max_len)
        partition.note_total(values.shape[0])
        return cls(Packed(values, partition=partition))

    @classmethod
    def from_offsets(
        cls,
        values: Tensor,
        offsets: Tensor | Sequence[int],
        *,
        max_len: int | None = None,
        validate: bool = True,
    ) -> NestedBatch:
        """Batch from packed ``values (total, *feature)`` and ``offsets (B + 1,)`` (TF row_splits).

        Parameters
        ----------
        values : Tensor
            ``(total, *feature)``, shared.
        offsets : Tensor or sequence of int
            Sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``. A Python sequence is checked
            on the host.
        max_len : int, optional
            The padded length, known on the host: at least the longest sample (checked with
            ``validate``), and the width of :meth:`padded` (saves reading the largest length
            from the device later).
        validate : bool, default True
            Check that the offsets start at 0, never decrease, end at ``len(values)`` and that
            no sample is longer than ``max_len``. For device offsets this costs four small
            device ops and one read of two numbers (a sync); pass False for trusted offsets on a
            hot path.
        """
        # The checks' plain cases inline (no frame; each costs about 1 us between large calls).
        if type(values) is not Tensor or values.dim() < 1:
            check_values(values)  # (a tensor of at least one dim)
        if max_len is not None and (type(max_len) is not int or max_len < 0):
            max_len = check_count(max_len, "max_len")
        if not isinstance(offsets, Tensor):
            host = host_ints(offsets, "offsets")
            check_host_offsets(host, values.shape[0], max_len)
            lengths = [b - a for a, b in zip(host, host[1:])]
            return cls.from_lengths(values, lengths, max_len=max_len)
        if type(offsets) is not Tensor or offsets.dtype is not torch.int64 \
                or offsets.dim() != 1 or offsets.device != values.device:
            offsets = as_offsets(offsets, values.device)
        if validate:  # the check reads the longest sample: kept, never read again
            longest = check_offsets_on_device(offsets, values.shape[0], max_len)
            max_len = longest if max_len is None else max_len
        partition = RowPartition.from_offsets(offsets, max_len=max_len, total=values.shape[0])
        return cls.trusted(Packed.trusted(values, partition))

    @classmethod
    def from_row_ids(
        cls,
        values: Tensor,
        row_ids: Tensor,
        num_rows: int | None = None,
        *,
        validate: bool = True,
    ) -> NestedBatch:
        """Batch from packed ``values`` and the sample of every row (TF value_rowids).

        Parameters
        ----------
        values : Tensor
            ``(total, *feature)``.
        row_ids : Tensor
            ``(total,)`` integer, non-decreasing.
        num_rows : int, optional
            Number of samples ``B`` (TF ``nrows``), so trailing empty samples exist. Default:
            ``row_ids[-1] + 1`` (read from the device).
        validate : bool, default True
            Check that ``row_ids`` is sorted and in ``[0, num_rows)`` (reads device values).
        """
        check_values(values)
        check_integer_tensor(row_ids, "row_ids")
        if num_rows is not None:
            num_rows = check_count(num_rows, "num_rows")
            if num_rows > _MAX_SAMPLES:
                raise ValueError(
                    f"num_rows={num_rows} is more samples than a batch can hold (at most "
                    f"{_MAX_SAMPLES}); their lengths alone would take "
                    f"{num_rows * 8 / 2**30:.0f} GiB"
                )
        if row_ids.dim() != 1 or row_ids.shape[0] != values.shape[0]:
            raise ValueError(
                f"row_ids must have shape ({values.shape[0]},) (one per row of values), got "
                f"{tuple(row_ids.shape)}"
            )
        # Ids on the host beside data on a device are read and counted there: no sync.
        host = row_ids.is_cpu and not values.is_cpu
        row_ids = row_ids.to(device=row_ids.device if host else values.device, dtype=torch.int64)
        if num_rows is None or (validate and row_ids.numel()):
            # One read of three numbers (host work for host ids).
            decreasing, first, last = read_device_values(torch.stack([
                (row_ids[1:] < row_ids[:-1]).any().long(), row_ids[:1].sum(), row_ids[-1:].sum()
            ])) if row_ids.numel() else (0, 0, -1)
            num_rows = last + 1 if num_rows is None else num_rows
            if validate and decreasing:
                raise ValueError("row_ids must be non-decreasing (rows grouped by sample)")
            if validate and row_ids.numel() and (first < 0 or last >= num_rows):
                raise ValueError(f"row_ids must lie in [0, num_rows={num_rows})")
        if host:
            lengths = torch.bincount(row_ids, minlength=num_rows)[:num_rows]
            partition = RowPartition.from_host_lengths_tensor(lengths, values.device)
            return cls(Packed(values, partition=partition))
        # Sorted row ids: sample i starts at the first row id >= i. One search of a fixed
        # size (bincount's output size would depend on the largest id: a sync).
        boundaries = torch.arange(num_rows + 1, device=row_ids.device)
        offsets = torch.searchsorted(row_ids, boundaries)
        partition = RowPartition.from_offsets(offsets, total=values.shape[0], row_ids=row_ids)
        return cls(Packed(values, partition=partition))

    @classmethod
    def from_shapes(
        cls, values: Tensor, shape_per_sample: Tensor, *, validate: bool = True
    ) -> NestedBatch:
        """Batch from packed ``values`` and per-sample ragged shapes ``(B, k)`` (kaolin packed)."""
        return cls(Packed(values, shape_per_sample=shape_per_sample, validate=validate))

    @classmethod
    def from_padded(
        cls,
        data: Tensor,
        lengths: Tensor | Sequence[int] | None = None,
        *,
        mask: Tensor | None = None,
        shape_per_sample: Tensor | None = None,
        padding_value: float | None = None,
        padding_side: str = "right",
        validate: bool = True,
    ) -> NestedBatch:
        """Batch from padded ``data (B, max_len, *feature)`` and lengths, a prefix mask or shapes.

        Parameters
        ----------
        data : Tensor
            ``(B, *padded_shape, *feature)``; shared, not copied.
        lengths : Tensor or sequence of int, optional
            ``(B,)`` sizes along the one ragged dim. A sequence, or a 1-d integer tensor in host
            memory of up to :data:`~nestbatch.checks.HOST_TENSOR_SIZES` sizes, is checked on
            the host (no sync now or later; ``validate`` does not apply).
        mask : Tensor, optional
            ``(B, max_len)`` bool prefix mask (True then False in every row; a suffix mask with
            ``padding_side="left"``), instead of lengths.
        shape_per_sample : Tensor, optional
            ``(B, k)`` sizes for ``k >= 1`` ragged dims.
        padding_value : float, optional
            What the padded slots of ``data`` hold, when known.
        padding_side : {"right", "left"}, default "right"
            Where ``data``'s padding sits: after each sample or, for left-padded prompts (one
            ragged dim), before it.
        validate : bool, default True
            Check the sizes / mask against ``data`` (reads device values).
        """
        # The checks' plain cases inline (no frame; each costs about 1 us between large calls).
        if not isinstance(data, Tensor):
            check_tensor(data, "data")
        if (lengths is None) + (mask is None) + (shape_per_sample is None) != 2:
            check_one_of(lengths=lengths, mask=mask, shape_per_sample=shape_per_sample)
        if isinstance(lengths, Tensor):
            lengths = host_tensor_sizes(lengths)  # (a host tensor: read as a sequence)
        if mask is not None:
            check_tensor(mask, "mask")
            if mask.shape != data.shape[:2]:
                raise ValueError(
                    f"mask must have shape {tuple(data.shape[:2])} (B, max_len of data), got "
                    f"{tuple(mask.shape)}"
                )
            prefix = mask.flip(1) if padding_side == "left" else mask  # a suffix mask, backwards
            lengths = check_prefix_mask(prefix) if validate else mask.sum(1)
        elif lengths is not None and not isinstance(lengths, Tensor):
            # Lengths known on the host are checked on the host: no device sync now or later.
            host = checked_host_sizes(lengths, "lengths")
            if data.dim() < 2 or len(host.sizes) != data.shape[0] or host.largest > data.shape[1]:
                check_host_lengths_fit(data, host)  # (called to raise: no frame otherwise)
            partition = RowPartition.from_host_sizes(host, data.device, host.largest)
            padded = Padded.trusted(data, partition, padding_value)
            if padding_side != "right":
                check_padding_side(padding_side, 1)
                padded.padding_side = padding_side
            return cls.trusted(padded)
        return cls(
            Padded(
                data,
                lengths,
                shape_per_sample=shape_per_sample,
                padding_value=padding_value,
                padding_side=padding_side,
                # Lengths counted from a mask of the data's shape fit it by construction.
                validate=validate and mask is None,
            )
        )

    # ============================================================================ layouts
    def _remember(self, layout: RaggedLayout) -> None:
        """Cache the layout the batch is built on, under its key (:meth:`_keep` caches a
        converted one, unless autograd recorded it)."""
        if type(layout) is Packed:  # (most batches are built packed: tested first)
            key = Layout.PACKED
        elif isinstance(layout, Padded):
            filler, side = layout.padding_value, layout.padding_side
            if filler is None and side == "right":
                key = _RIGHT_UNKNOWN  # (made once: from_padded's common case)
            else:
                key = PaddedKey(None if filler is None else filler_key(filler), side)
        else:
            key = Layout.LIST
        self._cache[key] = layout

    @property
    def layout(self) -> Layout:
        """The layout the batch was built in."""
        if isinstance(self._primary, Packed):
            return Layout.PACKED
        return Layout.PADDED if isinstance(self._primary, Padded) else Layout.LIST

    @property
    def materialized_layouts(self) -> tuple[Layout, ...]:
        """Layouts already computed (and cached) for this batch."""
        kinds = {Layout.PADDED if type(key) is PaddedKey else key for key in self._cache}
        return tuple(kind for kind in Layout if kind in kinds)

    def has_layout(self, kind: Layout) -> bool:
        """Whether a layout of ``kind`` is already computed (and cached) for this batch."""
        return cached_layout(self, kind) is not None

    def packed(self) -> Packed:
        """The batch as :class:`~nestbatch.layouts.Packed` (converted once, then cached; see
        :meth:`_keep` for conversions autograd records).

        In stored order: the ragged dim is first in every sample whatever :attr:`ragged_dim`
        is, and the feature dims are the other logical dims in order.
        """
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        cached = self._cache.get(Layout.PACKED)
        if cached is None:
            primary = self._primary
            if type(primary) is Padded and primary.padding_side == "right":  # (to_packed's case)
                cached = self._keep(Layout.PACKED, convert.padded_to_packed(primary))
            else:
                cached = self._keep(Layout.PACKED, convert.to_packed(primary))
        return cached

    def padded(
        self,
        padding_value: float | None = 0.0,
        max_shape: Sequence[int | None] | None = None,
        *,
        padding_side: str = "right",
    ) -> Padded:
        """The batch as :class:`~nestbatch.layouts.Padded` (converted once, then cached).

        In stored order, ``(B, max_len, *feature_shape)`` whatever :attr:`ragged_dim` is (see
        :meth:`to_padded_tensor` for the logical order).

        Parameters
        ----------
        padding_value : float or None, default 0
            Filler of the padded slots. ``None`` accepts whatever filler a cached padded layout
            holds (saves a fill pass when the consumer masks anyway); 0 if none is cached.
        max_shape : sequence of int, optional
            Pad the ragged dims to this size instead of the largest sample's (kaolin's
            ``max_shape``; ``None`` / -1 entries mean the maximum). Not cached.
        padding_side : {"right", "left"}, default "right"
            Pad after each sample, or before it (one ragged dim; as ``pad_sequence(...,
            padding_side="left")``, the layout decoder-only language models batch prompts in;
            its :attr:`~nestbatch.layouts.Padded.mask` is then a suffix mask).
        """
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        if max_shape is not None:
            filler = 0.0 if padding_value is None else padding_value
            return convert.to_padded(self._primary, filler, max_shape, padding_side)
        if padding_value is None:
            for key, layout in self._cache.items():
                if type(key) is PaddedKey and key.side == padding_side:
                    if layout is self._primary:
                        self._stamp_stored(layout.data)  # (its filler is claimed)
                    return layout
            padding_value = 0.0
        if padding_side != "right":
            check_padding_side(padding_side, self.num_ragged_dims)
            key = PaddedKey(filler_key(padding_value), padding_side)
        elif type(padding_value) is float and padding_value == 0 \
                and math.copysign(1.0, padding_value) > 0:
            key = _RIGHT_ZEROS  # the default (+0.0, not -0.0), whose key is made once
        else:
            key = PaddedKey(filler_key(padding_value), padding_side)
        cached = self._cache.get(key)
        if cached is self._primary:
            self._stamp_stored(cached.data)  # (its filler is claimed: a write must show)
        if cached is None:
            # Conversions between list and padded go through packed rows: cached ones first.
            source = self._cache.get(Layout.PACKED)
            source = self._primary if source is None else source
            if key is _RIGHT_ZEROS and type(source) is Packed:  # (to_padded's first case)
                converted = convert.packed_to_padded(source, padding_value)
            else:
                converted = convert.to_padded(source, padding_value, None, padding_side)
            cached = self._keep(key, converted)
        return cached

    def tensor_list(self) -> TensorList:
        """The batch as :class:`~nestbatch.layouts.TensorList` (converted once, then cached).

        Raises
        ------
        ValueError
            For a batch of ragged rank ``r >= 2``: its samples are batches of ragged rank
            ``r - 1`` (:meth:`unbind`), not tensors.
        """
        if self._partition.ragged_rank > 1:
            raise ValueError(
                f"a batch of ragged rank {self._partition.ragged_rank} has no list of tensors: "
                "its samples are batches of their rows (unbind())"
            )
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        cached = self._cache.get(Layout.LIST)
        if cached is None:
            cached = self._keep(Layout.LIST, convert.to_list(self._list_source()))
        return cached

    def _keep(self, key: Any, layout: RaggedLayout) -> RaggedLayout:
        """Cache ``layout`` unless the stored data needs a gradient, and return it.

        A conversion recorded by autograd is not reused: the graph's saved tensors are freed
        by the first ``backward()``, so a second use of a cached one would fail; each use makes
        its own conversion instead, as each torch op builds its own node. Nor is one made under
        ``no_grad`` of data that needs a gradient: read after the block, it would carry no
        graph. One made in inference mode is kept only for stored inference tensors (later
        writes outside the mode could not reach it). Conversions of data that needs no gradient
        are cached.
        """
        if torch.compiler.is_compiling():
            return layout  # a traced graph keeps no state on the batch (nor reads grad_fn)
        # Written out: this runs on every conversion. ``stored``: the primary layout's one
        # tensor (None for a list of samples).
        primary = self._primary
        kind = type(primary)
        stored = primary.values if kind is Packed else primary.data if kind is Padded else None
        if stored.requires_grad if stored is not None else any(
                t.requires_grad for t in primary.tensors):
            if type(layout) is Packed:  # (a view over its rows is watched: with_values)
                self._unkept = weakref.ref(layout.values)
            return layout
        if torch.is_inference_mode_enabled():
            # (Inference tensors keep no version counter: nothing is stamped.)
            if all(t.is_inference() for t in _stored_tensors(primary)):
                self._cache[key] = layout
            return layout
        self._cache[key] = layout
        # The version stamps _fresh compares: the stored tensor's with the first conversion's.
        # A list of samples is not stamped (one counter per sample: too many to read on every
        # access).
        versions = self._versions
        kind = type(layout)
        tensor = layout.values if kind is Packed else layout.data if kind is Padded else None
        try:
            if not versions and stored is not None:
                versions[None] = (stored, stored._version)
            if tensor is not None:
                versions[key] = (tensor, tensor._version)
        except RuntimeError:  # an inference tensor (made in inference mode) keeps no counter
            return layout  # (not stamped)
        return layout

    def _stamp_stored(self, stored: Tensor) -> None:
        """Stamp the stored tensor's version (as the first cached conversion does), unless
        something is stamped already, where it is handed out with a claim on its contents (a
        padded batch's filler): a write through it then shows at the next read
        (:meth:`_fresh`), which drops the claim."""
        if self._versions or torch.compiler.is_compiling():
            return  # (stamped; or a traced graph, which keeps no state)
        try:
            version = stored._version
        except RuntimeError:  # an inference tensor (made in inference mode) keeps no counter
            return
        self._versions[None] = (stored, version)

    def _watch(self, held: RaggedLayout | Tensor) -> None:
        """Compare and write back ``held``, a conversion not cached (the stored data needs a
        gradient) that a view op's result (its packed rows) or ``to(layout)`` holds, as cached
        ones are: its writes reach the stored data (recorded by autograd, which raises for a
        leaf, as for a view of a leaf), and packed rows are rewritten after writes to the
        batch. Kept until a read of the batch finds nothing else holding it
        (:meth:`_sweep_watched`): a write through a temporary view is not lost."""
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return  # (no state kept in a traced graph; inference tensors have no counters)
        tensor = held if isinstance(held, Tensor) else _single_tensor(held)
        if tensor is None or id(tensor) in self._watched:
            return
        stored = _single_tensor(self._primary)
        if stored is not None:
            self._stamp_stored(stored)
        self._watched[id(tensor)] = (held, tensor._version)

    def _sweep_watched(self) -> dict[int, RaggedLayout]:
        """The watched conversions written since they were stamped (as layouts); the others
        nothing else holds any more are let go (nothing can write them now)."""
        written = {}
        for key in list(self._watched):
            held, version = self._watched.pop(key)
            layout = Packed.trusted(held, self._partition) if isinstance(held, Tensor) else held
            if _single_tensor(layout)._version != version:
                written[key] = layout
                self._watched[key] = (held, version)
                continue
            del layout
            alive = weakref.ref(held)
            del held  # (this was the last reference unless a view or a batch holds it)
            held = alive()
            if held is not None:
                self._watched[key] = (held, version)
        return written

    def _needs_watching(self, layout: RaggedLayout) -> bool:
        """Whether ``layout``, just converted, was left uncached because the stored data needs a
        gradient (a layout the batch holds, or a list, is compared already or never)."""
        return type(layout) in (Packed, Padded) and layout is not self._primary and \
            all(cached is not layout for cached in self._cache.values()) and \
            _needs_gradient(self._primary)

    def _unkept_rows(self) -> Tensor | None:
        """The rows of the last packed conversion :meth:`_keep` did not cache, while alive."""
        return None if self._unkept is None else self._unkept()

    def _fresh(self) -> None:
        """Bring the cached layouts in line with in-place writes that did not go through the
        batch: a write to its stored tensor (``b.values.add_(1)`` on a packed batch) drops the
        conversions cached before it; a write into a cached conversion (through a view op's
        result, ``b.transpose(1, 2).add_(1)`` on a padded batch, whose view ops run on the
        packed rows) is copied into the stored tensor, as a torch view's write reaches its
        base, and drops the other conversions (a stored padded tensor written from outside
        loses its padding value: its padding may hold anything). Compares torch's version
        counters, stamped as the conversions were cached (one read per cached layout; nothing
        while only the primary layout is cached). A list of samples is not compared (one
        counter per sample), nor is anything made in inference mode (no counters).

        Raises
        ------
        RuntimeError
            When two of the batch's layouts that are not views of each other were written in
            place since the last read: no single value is right.
        """
        if self._freshening or torch.compiler.is_compiling():
            # (A batch linked both ways asked back while this one is being freshened; or a
            # traced graph, which keeps no state on the batch: reading version counters there
            # would be data-dependent.)
            return
        self._freshening = True
        try:
            self._fresh_links()
            self._fresh_own()
        finally:
            self._freshening = False

    def _fresh_links(self) -> None:
        """Freshen the batches this one is linked to first: the one whose rows it views (its
        data may have changed) and those made of its layouts (a write into one of their own
        layouts reaches theirs, and so this one's, when they are freshened)."""
        base = self._base_batch
        if base is not None and (base._versions or base._watched or base._derived
                                 or base._base_batch is not None):
            base._fresh()  # (rewrites the rows this batch views if its own data changed)
        if self._derived:
            alive = [ref for ref in self._derived if ref() is not None]
            self._derived = alive
            for ref in alive:
                child = ref()
                if child is not None and (child._versions or child._watched or child._derived):
                    child._fresh()

    def _fresh_own(self) -> None:
        """:meth:`_fresh` of this batch's own layouts (the linked ones are fresh)."""
        watched = self._sweep_watched() if self._watched else {}
        for tensor, version in self._versions.values():  # (the hot path: no frame)
            if tensor._version != version:
                break
        else:
            if not watched:
                return
        if torch.compiler.is_compiling():
            return  # (a traced graph keeps no state on the batch)
        changed = [key for key, (tensor, version) in self._versions.items()
                   if tensor._version != version]
        # One write reaches every layout that views the same tensor (samples all of one length
        # make views): group them by what they view.
        bases = {id(_base_of(self._versions[key][0])) for key in changed} | {
            id(_base_of(_single_tensor(layout))) for layout in watched.values()}
        if len(bases) > 1:
            raise RuntimeError(
                "two layouts of this batch were written in place since they were made (say its "
                "stored data and a view op's result over a cached conversion): their values "
                "disagree. Write through one of them, or clone() what you write into"
            )
        written = None if None in changed else changed[0] if changed else next(iter(watched))
        if written in self._cache:
            self._write_back(self._cache[written])
        elif written is not None:
            try:
                self._write_back(watched[written])
            except RuntimeError:
                # autograd refused it (a leaf that needs a gradient, written through a view):
                # raised once; the batch keeps its values.
                del self._watched[written]
                raise
        elif isinstance(self._primary, Padded) and self._primary.padding_value is not None:
            # Written from outside, its padding may hold anything now.
            primary = self._primary
            self._primary = Padded.trusted(primary.data, primary.partition, None,
                                           primary.padding_side)
        self._rewrite_cache(written)

    def _rewrite_cache(self, current: Any = None) -> None:
        """After the stored values changed in place: drop the cached conversions, but for the
        one under key ``current`` (already equal to them) and the packed rows, which are
        rewritten in place: view ops run on the packed rows, so their results may view them
        and, as torch views, must see the write (one conversion and one copy). Where autograd
        recorded the write, the rewritten rows are not kept: the batch converts again, with
        the graph."""
        primary = self._primary
        kept = {key: self._cache[key] for key in (Layout.PACKED, current)
                if key in self._cache and self._cache[key] is not primary}
        written = kept.get(current)
        if type(written) is Padded and written.padding_value is not None:
            # Written through, its padding may hold anything now: kept as padding of no known
            # value (a later padded(value) fills a new one; writes through it still reach us).
            del kept[current]
            current = PaddedKey(None, written.padding_side)
            kept[current] = Padded.trusted(written.data, written.partition, None,
                                           written.padding_side)
        # Watched packed rows are rewritten as cached ones; other watched layouts are let go,
        # as other cached conversions are dropped.
        watched = {key: held for key, (held, _) in self._watched.items()
                   if isinstance(held, Tensor) or type(held) is Packed or key == current}
        self._cache.clear()
        self._versions.clear()
        self._watched = {}
        self._remember(primary)
        stale = [layout for key, layout in (*kept.items(), *(
                     (key, Packed.trusted(held, self._partition) if isinstance(held, Tensor)
                      else held) for key, held in watched.items()))
                 if type(layout) is Packed and key != current and (
                     not isinstance(primary, Padded)
                     or _base_of(layout.values) is not _base_of(primary.data))]
        if stale:
            # Recorded where the write was (an operand needing a gradient): views of the rows
            # hold the graph of the values they show, as views of a tensor written in place.
            with torch.set_grad_enabled(_needs_gradient(primary)):
                rows = convert.to_packed(primary).values
                for layout in stale:
                    layout.values.copy_(rows)
        for key, layout in kept.items():  # (not kept where autograd recorded the write)
            self._keep(key, layout)
        for held in watched.values():
            self._watch(held)

    def _write_back(self, layout: RaggedLayout) -> None:
        """Copy the values of a cached ``layout`` into the stored tensors, in place (the
        padding of a stored padded tensor is kept)."""
        primary = self._primary
        # Recorded where the written layout has a graph (it was written with an operand that
        # needs a gradient): the stored tensor then holds it, as a base written through a view.
        with torch.set_grad_enabled(_needs_gradient(layout)):
            if isinstance(primary, Padded):
                rows = layout.values if type(layout) is Packed else convert.to_packed(layout).values
                mask = primary.mask
                mask = mask.view(*mask.shape, *(1,) * len(primary.feature_shape))
                primary.data.masked_scatter_(mask.expand_as(primary.data), rows)
            elif isinstance(primary, Packed):
                primary.values.copy_(convert.to_packed(layout).values)
            else:
                for stored, sample in zip(primary.tensors, convert.to_list(layout).tensors):
                    stored.copy_(sample)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """The samples, as views into the stored data where possible (``torch.nested``'s
        ``unbind``).

        In logical order: with the ragged dim at :attr:`ragged_dim`. Slicing needs the
        per-sample sizes on the host: read once (a sync) if only the device has them, then
        cached.
        """
        if dim != 0:
            raise NestedValueError(f"unbind is only supported along dim 0 (the batch), got "
                                   f"dim={dim}")  # (a RuntimeError too, as torch.nested's)
        if self._partition.ragged_rank > 1:
            return tuple(self._nested_sample(i) for i in range(self.batch_size))
        return tuple(self._logical(t) for t in self.tensor_list().tensors)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.unbind())

    def tolist(self) -> list:
        """The samples as nested Python lists of numbers (``Tensor.tolist``; TF ``to_list``).

        Reads every value on the host (a device sync on a GPU): the result is Python data. One
        copy of the packed rows to the host, cut into samples there. For the samples as
        tensors, :meth:`unbind`.
        """
        host = self
        if self.device.type != "cpu":
            values = self.packed().values.cpu()  # the one device-to-host copy
            host = NestedBatch.trusted(Packed.trusted(values, self._partition.to(values.device)),
                                       self._ragged_dim)
        if self._partition.ragged_rank > 1:
            rows = host.packed().values.tolist()
            for level in reversed(host.partition.levels):  # every level's rows cut out in turn
                offsets = level.host_offsets
                rows = [rows[a:b] for a, b in zip(offsets, offsets[1:])]
            return rows
        return [sample.tolist() for sample in host.unbind()]

    def _logical(self, sample: Tensor) -> Tensor:
        # A stored sample (ragged dim first) as the logical one: a view, no copy.
        return sample if self._ragged_dim == 1 else sample.movedim(0, self._ragged_dim - 1)

    def _list_source(self) -> RaggedLayout:
        # Samples are cut from packed rows or right-padded data: a cached layout of those kinds
        # first, then the primary one.
        cached = self._cache.get(Layout.PACKED)
        cached = cached_layout(self, Layout.PADDED) if cached is None else cached
        return self._primary if cached is None else cached

    # ============================================================================ metadata
    @property
    def partition(self) -> RowPartition:
        """The shared per-sample shapes and derived metadata."""
        return self._partition

    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        return self._partition.batch_size

    def __len__(self) -> int:
        return self._partition.batch_size

    @property
    def num_ragged_dims(self) -> int:
        """Number of ragged dims ``k``."""
        return self._partition.num_ragged_dims

    @property
    def ragged_dim(self) -> int:
        """Logical dim of the ragged dim (1 unless moved by ``transpose`` / ``permute``).

        Always 1 for a batch with several ragged dims (they stay leading, dims ``1..k``).
        """
        return self._ragged_dim

    @property
    def feature_shape(self) -> torch.Size:
        """Shape of the stored regular dims (the logical dims other than the batch and ragged
        ones, in order; those after the ragged dims when :attr:`ragged_dim` is 1)."""
        return torch.Size(self._primary.feature_shape)

    @property
    def sample_shape(self) -> tuple[int | None, ...]:
        """Logical shape of every sample, ``None`` at ragged dims: ``(4, None, 8)`` for samples
        ``(4, L_i, 8)`` (``ragged_dim=2``)."""
        feature = tuple(self.feature_shape)
        if self.num_ragged_dims > 1:
            return (None,) * self.num_ragged_dims + feature
        at = self._ragged_dim - 1
        return feature[:at] + (None,) + feature[at:]

    @property
    def dtype(self) -> torch.dtype:
        """Element dtype."""
        return self._primary.dtype

    @property
    def device(self) -> torch.device:
        """Device of the data."""
        return self._primary.device

    @property
    def is_cuda(self) -> bool:
        """Whether the data is on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        """Whether the data is on the CPU."""
        return self.device.type == "cpu"

    @property
    def itemsize(self) -> int:
        """Bytes of one element (``Tensor.itemsize``)."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the samples' elements, ``numel() * itemsize`` (padding not counted, as in
        :meth:`numel`)."""
        return self.numel() * self.dtype.itemsize

    @property
    def lengths(self) -> Tensor:
        """``(B,)`` int64: elements of every sample along its (flattened) ragged dims."""
        return self._partition.lengths

    @property
    def offsets(self) -> Tensor:
        """``(B + 1,)`` int64: start of every sample in the packed values, then the total."""
        return self._partition.offsets

    @property
    def shape_per_sample(self) -> Tensor:
        """``(B, k)`` int64: the ragged shape of every sample."""
        return self._partition.shape_per_sample

    @property
    def row_ids(self) -> Tensor:
        """``(total,)`` int64: the sample of every packed row (TF value_rowids)."""
        return self._partition.row_ids

    @property
    def max_shape(self) -> tuple[int, ...]:
        """Largest size of every ragged dim (may read sizes from the device once)."""
        return self._partition.max_shape

    @property
    def values(self) -> Tensor | NestedBatch:
        """``(total, *feature)``: the packed rows of all samples (stored order: the ragged dim
        first, whatever :attr:`ragged_dim` is).

        For a batch of ragged rank ``r >= 2``, one level down as TensorFlow's ``values``: a batch
        of ragged rank ``r - 1`` whose samples are every sample's rows, in order (the packed
        rows themselves are ``packed().values``).
        """
        if self._partition.ragged_rank > 1:
            return self._level_down(self.packed().values, self._partition)
        return self.packed().values

    @staticmethod
    def _level_down(values: Tensor, partition: RowPartition) -> NestedBatch:
        """The batch of the outermost rows of ``partition`` (nested) over packed ``values``."""
        inner = partition.levels[1:]
        below = inner[0] if len(inner) == 1 else RowPartition.nested(inner)
        return NestedBatch.trusted(Packed.trusted(values, below))

    @property
    def mask(self) -> Tensor:
        """``(B, *padded_shape)`` bool: True on padded slots that hold sample elements (over the
        stored padded data, whose ragged dims follow the batch dim)."""
        return self.padded(None).mask

    def dim(self) -> int:
        """Number of dims: 1 (batch) + ragged dims + feature dims."""
        return 1 + self.num_ragged_dims + len(self.feature_shape)

    @property
    def ndim(self) -> int:
        """Same as :meth:`dim`."""
        return self.dim()

    @property
    def shape(self) -> NestedSize:
        """Logical shape, as torch.nested's: ``NestedSize([B, j1, *feature])``, a
        :class:`~nestbatch.layouts.sizes.RaggedSize` at every ragged dim (it differs per sample)
        and ints elsewhere; ``shape[-1:]`` of the feature dims is a ``torch.Size``."""
        ragged = iter(range(self.num_ragged_dims))
        return NestedSize((self.batch_size, *(
            RaggedSize(self._partition, next(ragged)) if size is None else size
            for size in self.sample_shape
        )))

    def size(self, dim: int | None = None) -> int | RaggedSize | NestedSize:
        """Size of logical ``dim``, as ``torch.Tensor.size``: an int, or a
        :class:`~nestbatch.layouts.sizes.RaggedSize` for a ragged dim (torch.nested's nested
        int); with no ``dim``, :attr:`shape`.

        Raises
        ------
        IndexError
            For a dim out of range.
        """
        if dim is None:
            return self.shape
        dim = normalize_dim(dim, self.dim())
        kind, stored = storage_dim(self, dim)
        if kind == "batch":
            return self.batch_size
        if kind == "ragged":
            return RaggedSize(self._partition, stored - 1)
        return self.feature_shape[stored - 1]

    # ============================================================================ tensor surface
    def _map_primary(
        self, fn: Callable[[Tensor], Tensor], *, partition: RowPartition | None = None,
        keeps_filler: bool = True,
    ) -> NestedBatch:
        """New batch whose primary layout's tensors are ``fn`` of this one's."""
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        layout = self._primary
        partition = partition or layout.partition
        rd = self._ragged_dim
        if isinstance(layout, Packed):
            return NestedBatch(Packed(fn(layout.values), partition=partition), rd)
        if isinstance(layout, Padded):
            filler = layout.padding_value if keeps_filler else None
            padded = Padded(fn(layout.data), partition=partition, padding_value=filler,
                            padding_side=layout.padding_side)
            return NestedBatch(padded, rd)
        tensors = [fn(t) for t in layout.tensors]
        # (No sample to read the new dtype from: fn of an empty tensor of the old one tells it.)
        dtype = (tensors[0] if tensors else fn(torch.empty(0, dtype=layout.dtype))).dtype
        listed = TensorList(tensors, layout.num_ragged_dims, feature_shape=layout.feature_shape,
                            dtype=dtype, partition=partition)
        return NestedBatch(listed, rd)

    def to(self, *args: Any, **kwargs: Any) -> NestedBatch:
        """Another layout (``to(Layout.PADDED)``), or another device / dtype, as ``Tensor.to``.

        ``to(layout)`` returns a batch stored in that layout (converted once and also cached
        here); ``to(device, dtype, ...)`` converts the data like :meth:`torch.Tensor.to`.
        """
        if len(args) == 1 and not kwargs and isinstance(args[0], Layout):
            convert_to = {Layout.PACKED: self.packed, Layout.PADDED: self.padded}
            layout = convert_to.get(args[0], self.tensor_list)()
            if layout is self._primary:
                return self  # (stored so already: as Tensor.to with nothing to change)
            if self._needs_watching(layout):
                self._watch(layout)  # (not cached: the stored data needs a gradient)
            converted = NestedBatch(layout, self._ragged_dim)
            self._add_derived(converted)
            return converted
        if args and isinstance(args[0], NestedBatch):  # to(other): its dtype and device
            args = (args[0].device, args[0].dtype, *args[1:])
        # copy=True, by keyword or in its place: after (dtype | tensor, non_blocking) or
        # (device, dtype, non_blocking).
        copy_at = 2 if args and isinstance(args[0], torch.dtype | Tensor) else 3
        copy = kwargs.get("copy", len(args) > copy_at and args[copy_at])
        # The probe's memory format is left alone: channels_last needs the data's rank.
        probe = torch.empty(0, dtype=self.dtype, device=self.device).to(
            *args, **{key: v for key, v in kwargs.items() if key != "memory_format"})
        if probe.dtype == self.dtype and probe.device == self.device and not copy and \
                kwargs.get("memory_format", torch.preserve_format) is torch.preserve_format:
            return self
        partition = self._partition.to(probe.device)
        keeps = probe.dtype == self.dtype
        return self._map_primary(
            lambda t: t.to(*args, **kwargs), partition=partition, keeps_filler=keeps
        )

    def cpu(self) -> NestedBatch:
        """The batch on the CPU."""
        return self.to("cpu")

    def cuda(self, device: int | str | torch.device | None = None) -> NestedBatch:
        """The batch on a CUDA device."""
        if device is None:
            device = torch.device("cuda")
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return self.to(device)

    def detach(self) -> NestedBatch:
        """The batch detached from the autograd graph (shares storage)."""
        return self._map_primary(Tensor.detach)

    @property
    def data(self) -> NestedBatch:
        """``Tensor.data``: the batch detached, sharing storage (:meth:`detach`). Unlike
        torch's ``.data``, it shares the version counters too, so a write through it is seen
        by the batch's cached layouts (which would go stale) and by autograd's checks. As for
        any write to the samples of a batch stored as a list of them (they carry no version
        stamp), the batch's cached conversions do not see such a write."""
        return self.detach()

    def clone(self, *, memory_format: torch.memory_format = torch.preserve_format
              ) -> NestedBatch:
        """A copy of the batch with its own storage (differentiable); ``memory_format`` as
        ``Tensor.clone`` (the copy of a moved ragged dim stays a view of new storage in stored
        order, as every batch is)."""
        return self._map_primary(lambda t: t.clone(memory_format=memory_format))

    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format
                   ) -> NestedBatch:
        """The batch with contiguous storage (``Tensor.contiguous``)."""
        return self._map_primary(lambda t: t.contiguous(memory_format=memory_format))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> NestedBatch:
        """``Tensor.unflatten`` of a feature dim (``q.unflatten(-1, (H, E))``). Defined here,
        not made by the registry: ``torch.compile`` cannot trace ``Tensor.unflatten`` (a Python
        method of torch's) as the function behind a method of a batch made inside a graph."""
        return torch.unflatten(self, dim, sizes)

    def type(self, dtype: torch.dtype | str | None = None, non_blocking: bool = False
             ) -> str | NestedBatch:
        """``Tensor.type``: without ``dtype``, the type name of the stored tensors
        (``"torch.FloatTensor"``); with a dtype or such a name, the batch in that dtype."""
        probe = torch.empty(0, dtype=self.dtype, device=self.device)
        if dtype is None:
            return probe.type()
        return self.to(probe.type(dtype).dtype, non_blocking=non_blocking)

    def share_memory_(self) -> NestedBatch:
        """Move the stored tensors to shared memory, in place (``Tensor.share_memory_``)."""
        for tensor in self.stored():
            tensor.share_memory_()
        return self

    def is_shared(self) -> bool:
        """Whether every stored tensor is in shared memory (``Tensor.is_shared``)."""
        return all(tensor.is_shared() for tensor in self.stored())

    def adjoint(self) -> NestedBatch:
        """The last two dims swapped and conjugated (``Tensor.adjoint``)."""
        return self.transpose(-2, -1).conj()

    @property
    def mT(self) -> NestedBatch:
        """The last two dims swapped (``Tensor.mT``): ``transpose(-2, -1)``."""
        return self.transpose(-2, -1)

    @property
    def is_nested(self) -> bool:
        """True, as ``Tensor.is_nested`` of a torch.nested tensor (code that branches on it)."""
        return True

    # ------------------------------------------------------------------------------- autograd
    # The batch's autograd state is that of the tensors it stores (its primary layout's): they
    # are the leaves a batch built with ``requires_grad`` holds, and every other layout and op
    # result is differentiated back to them.
    def stored(self) -> tuple[Tensor, ...]:
        """The tensors the batch stores: the packed values, the padded data (padding slots
        included) or the samples, whichever layout it was built in."""
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        return _stored_tensors(self._primary)

    def with_stored(self, tensors: Sequence[Tensor]) -> NestedBatch:
        """A batch of this structure and layout over other ``tensors`` of the shapes of
        :meth:`stored` (its gradients, say); a padded one's padding value is not kept."""
        replacements = iter(tensors)
        return self._map_primary(lambda _: next(replacements), keeps_filler=False)

    @property
    def requires_grad(self) -> bool:
        """Whether gradients flow to the stored data."""
        return any(t.requires_grad for t in self.stored())

    def requires_grad_(self, requires_grad: bool = True) -> NestedBatch:
        """Set ``requires_grad`` on the stored data, in place; returns ``self``.

        Layouts cached before the call were computed without a graph, so they are dropped.
        """
        for t in self.stored():
            t.requires_grad_(requires_grad)
        self._cache.clear()  # (the values are unchanged: views of a cached layout stay right)
        self._versions.clear()
        self._remember(self._primary)
        return self

    @property
    def is_leaf(self) -> bool:
        """Whether the stored data are leaves of the autograd graph (as ``Tensor.is_leaf``)."""
        return all(t.is_leaf for t in self.stored())

    @property
    def grad_fn(self) -> Any:
        """The autograd node that made the stored data (None for a leaf)."""
        return next((t.grad_fn for t in self.stored() if t.grad_fn is not None), None)

    def retain_grad(self) -> None:
        """Keep :attr:`grad` of this non-leaf batch on ``backward`` (as ``Tensor.retain_grad``)."""
        for t in self.stored():
            t.retain_grad()

    @property
    def grad(self) -> NestedBatch | None:
        """Gradient of the stored data as a batch of the same structure (None if absent)."""
        grads = [t.grad for t in self.stored()]
        if any(g is None for g in grads):
            return None
        return self.with_stored(grads)

    @grad.setter
    def grad(self, gradient: NestedBatch | None) -> None:
        """``b.grad = None`` clears the stored tensors' gradients (``zero_grad(set_to_none)``);
        a batch of the same samples sets them, laid out as this batch is stored."""
        stored = self.stored()
        if gradient is None:
            for tensor in stored:
                tensor.grad = None
            return
        if not isinstance(gradient, NestedBatch):
            raise TypeError(f"grad must be None or a NestedBatch, got {type(gradient).__name__}")
        if gradient.shape != self.shape:
            raise ValueError(f"grad must have the batch's shape {self.shape}, got "
                             f"{gradient.shape}")
        primary = self._primary
        if isinstance(primary, Padded):
            grads = (gradient.padded(0.0, tuple(primary.padded_shape),
                                     padding_side=primary.padding_side).data,)
        else:
            grads = _stored_tensors(gradient.packed() if isinstance(primary, Packed)
                                    else gradient.tensor_list())
        for tensor, grad in zip(stored, grads):
            tensor.grad = grad

    def backward(
        self, gradient: NestedBatch | None = None, retain_graph: bool | None = None,
        create_graph: bool = False, inputs: Sequence[Tensor | NestedBatch] | None = None,
    ) -> None:
        """Accumulate the gradients of this batch's leaves, as ``Tensor.backward``.

        Parameters
        ----------
        gradient : NestedBatch
            The gradient of this batch: the same samples' shapes (``torch.ones_like(b)``).
            Required: a batch is never a scalar.
        retain_graph, create_graph, inputs
            As ``torch.autograd.backward``; ``inputs`` may hold batches.
        """
        torch.autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def with_values(self, values: Tensor, ragged_dim: int | None = None) -> NestedBatch:
        """A batch of the same structure with new packed ``values (total, *feature)``.

        ``values`` are in stored order (as :attr:`values`); the result presents the ragged dim
        at ``ragged_dim`` (default: this batch's :attr:`ragged_dim`).
        """
        check_tensor(values, "values")
        total = self._partition.total
        if values.dim() < 1 or values.shape[0] != total:
            raise ValueError(
                f"values must have {total} rows (one per packed row), got shape "
                f"{tuple(values.shape)}"
            )
        packed = Packed.trusted(values, self._partition.to(values.device))
        ragged_dim = self._ragged_dim if ragged_dim is None else ragged_dim
        # dim 1 is valid for every feature shape
        out = NestedBatch.trusted(packed) if ragged_dim == 1 else NestedBatch(packed, ragged_dim)
        rows = self._cache.get(Layout.PACKED)
        if rows is None and self._unkept is not None:
            unkept = self._unkept_rows()
            if unkept is not None and _base_of(values) is _base_of(unkept):
                # Rows not cached (the stored data needs a gradient): watched instead.
                rows = Packed.trusted(unkept, self._partition)
                self._watch(unkept)
        if rows is not None and _base_of(values) is _base_of(rows.values):
            # This batch's packed rows (cached or stored), or a view of them (a view op's
            # result): this batch brings them up to date before the new one reads them (a
            # write through another of its layouts reaches them at its next read).
            out._base_batch = self
            self._add_derived(out)
        return out

    def _add_derived(self, batch: NestedBatch) -> None:
        """Link ``batch``, made of this one's layouts, to be freshened before this one."""
        if len(self._derived) >= 32:  # (let the dead go before the list grows)
            self._derived = [ref for ref in self._derived if ref() is not None]
        self._derived.append(weakref.ref(batch))

    def map_values(self, fn: Callable[[Tensor], Tensor]) -> NestedBatch:
        """Apply ``fn`` to the packed values (TF ``map_flat_values``); keeps the structure."""
        return self.with_values(fn(self.values))

    def _nested_sample(self, i: int) -> NestedBatch:
        """Sample ``i`` (in range) of a batch of ragged rank ``r >= 2``: the batch of ragged rank
        ``r - 1`` of its rows, a view of the packed values (the sizes are read once, a sync, if
        only the device has them)."""
        partition = self._partition.select(torch.tensor([i]), [i])
        start, stop = self._partition.host_offsets[i : i + 2]
        values = self.packed().values[start:stop]
        return self._level_down(values, partition.to(values.device))

    # ======================================================================= padded tensor
    def to_padded_tensor(
        self, padding: float = 0.0, output_size: Sequence[int | None] | None = None,
        *, padding_side: str = "right",
    ) -> Tensor:
        """The padded tensor ``(B, *padded ragged sizes, *feature)`` in logical order
        (``torch.nested.to_padded_tensor``).

        Parameters
        ----------
        padding : float, default 0
            Filler of the slots past each sample.
        output_size : sequence of int, optional
            The full logical shape of the result (as torch's): the batch size and feature sizes
            as the batch has them, each ragged size at least the longest sample (None or -1:
            the longest). Default: the tightest.
        padding_side : {"right", "left"}, default "right"
            Pad after or before each sample (see :meth:`padded`).

        Returns
        -------
        Tensor
            ``padded(padding, ...).data`` with the ragged dim moved to :attr:`ragged_dim` (a
            view); the padded layout itself is cached when ``output_size`` is None. A batch
            stored padded wider than its longest sample gives a view of the tightest part
            (this reads the largest sizes from the device once when only the device has them:
            the output's shape needs them).
        """
        sizes = self._ragged_sizes_of(output_size)
        padded = self.padded(padding, sizes, padding_side=padding_side)
        data = padded.data if sizes is not None else padded.tightest().data  # (stored wider)
        return data if self._ragged_dim == 1 else data.movedim(1, self._ragged_dim)

    def _ragged_sizes_of(self, output_size: Sequence[int | None] | None) -> list | None:
        """The padded ragged sizes an ``output_size`` (the full logical shape) asks for."""
        if output_size is None:
            return None
        output_size = tuple(output_size)
        wanted = (self.batch_size, *self.sample_shape)
        if len(output_size) != len(wanted):
            raise ValueError(
                f"output_size must have {len(wanted)} entries (the batch, then the logical "
                f"sample shape {tuple(self.sample_shape)}), got {output_size}"
            )
        ragged = []
        for dim, (size, have) in enumerate(zip(output_size, wanted)):
            if have is None:  # (this batch's own RaggedSize there: the longest, as -1)
                longest = size is None or size == -1 or isinstance(size, RaggedSize)
                ragged.append(None if longest else size)
            elif size is not None and size != -1 and size != have:
                raise ValueError(
                    f"output_size[{dim}]={size} does not match the batch's size {have} there; "
                    "only ragged dims are padded"
                )
        return ragged

    def pin_memory(self) -> NestedBatch:
        """The batch with its data in page-locked memory (``DataLoader(pin_memory=True)``)."""
        return self._map_primary(Tensor.pin_memory)

    def is_pinned(self) -> bool:
        """Whether the stored data is in page-locked memory."""
        return all(t.is_pinned() for t in self.stored())

    # ============================================================================ torch interop
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _DISPATCH[0](func, types, args, kwargs or {})

    def __getstate__(self) -> dict:
        # Only the primary layout travels; other layouts are recomputed on demand.
        if self._versions or self._watched or self._derived or self._base_batch is not None:
            self._fresh()
        return {"primary": self._primary, "ragged_dim": self._ragged_dim}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["primary"], state.get("ragged_dim", 1))

    def __repr__(self) -> str:
        header = (
            f"batch_size={self.batch_size}, num_ragged_dims={self.num_ragged_dims}, "
            f"feature_shape={tuple(self.feature_shape)}, dtype={self.dtype}, "
            f"device={self.device}, layout={self.layout.value}"
        )
        if self._ragged_dim != 1:
            header += f", ragged_dim={self._ragged_dim}, sample_shape={self.sample_shape}"
        if self._partition.ragged_rank > 1:
            header += f", ragged_rank={self._partition.ragged_rank}"
        if self.requires_grad:
            header += ", requires_grad=True"
        shown = min(self.batch_size, 6)
        lines = []
        for i in range(shown):
            text = repr(sample_of(self, i).detach()).replace("\n", "\n    ")
            lines.append(f"    {text},")
        if self.batch_size > shown:
            lines.append(f"    ... ({self.batch_size - shown} more)")
        body = "\n".join(lines)
        return f"NestedBatch([\n{body}\n], {header})" if lines else f"NestedBatch([], {header})"


# ======================================================================= version counters
def _stored_tensors(layout: RaggedLayout) -> tuple[Tensor, ...]:
    """The tensors ``layout`` stores: the packed values, the padded data (padding slots
    included) or the samples."""
    if isinstance(layout, Packed):
        return (layout.values,)
    if isinstance(layout, Padded):
        return (layout.data,)
    return tuple(layout.tensors)


def _single_tensor(layout: RaggedLayout) -> Tensor | None:
    """The one tensor a packed or padded layout stores (None for a list of samples)."""
    kind = type(layout)
    return layout.values if kind is Packed else layout.data if kind is Padded else None


def _needs_gradient(layout: RaggedLayout) -> bool:
    """Whether a tensor ``layout`` stores needs a gradient."""
    return any(t.requires_grad for t in _stored_tensors(layout))


def _base_of(tensor: Tensor) -> Tensor:
    """The tensor ``tensor`` views (itself if none): views of one base share a version
    counter."""
    return tensor if tensor._base is None else tensor._base


# ================================================================ internal API for the ops
# What nestbatch's upper layers (ops/ and compat/) may do with a batch
# beyond its public surface; they use nothing else of its internals.
def cached_layout(batch: NestedBatch, kind: Layout) -> RaggedLayout | None:
    """The cached layout of ``kind`` (for a padded one, whatever its filler; right-padded, the
    only padding ops read), or None."""
    if batch._versions or batch._watched or batch._derived or batch._base_batch is not None:
        batch._fresh()
    if kind is Layout.PADDED:
        return next((lay for key, lay in batch._cache.items()
                     if type(key) is PaddedKey and key.side == "right"), None)
    return batch._cache.get(kind)


def sample_of(batch: NestedBatch, i: int) -> Tensor:
    """Sample ``i`` of ``batch`` in logical order, a view into the stored data (negative ``i``
    counts from the end): what ``batch[i]`` returns."""
    check_batch_indices((i,), batch.batch_size)
    i %= batch.batch_size
    if batch._partition.ragged_rank > 1:
        return batch._nested_sample(i)
    if batch._versions or batch._watched or batch._derived or batch._base_batch is not None:
        batch._fresh()
    layout = batch._primary
    if Layout.LIST in batch._cache:
        return batch._logical(batch._cache[Layout.LIST].tensors[i])
    shape = batch._partition.host_shapes[i]
    if isinstance(layout, Packed):
        start, stop = batch._partition.host_offsets[i : i + 2]
        return batch._logical(layout.values[start:stop].view(*shape, *layout.feature_shape))
    sample = layout.data[i]
    if layout.padding_side == "left":
        return batch._logical(sample.narrow(0, sample.shape[0] - shape[0], shape[0]))
    for d, size in enumerate(shape):
        sample = sample.narrow(d, 0, size)
    return batch._logical(sample)


def stored_layout(batch: NestedBatch) -> RaggedLayout:
    """The layout the batch was built in (the one in-place ops write into), with the writes
    made through its cached layouts (:meth:`NestedBatch._fresh`)."""
    if batch._versions or batch._watched or batch._derived or batch._base_batch is not None:
        batch._fresh()
    return batch._primary


def after_stored_write(batch: NestedBatch) -> None:
    """What an in-place op calls once it wrote the stored layout: the cached layouts are
    dropped, but the packed rows, rewritten in place for the results of view ops that view
    them (:meth:`NestedBatch._rewrite_cache`)."""
    batch._rewrite_cache()


def map_stored(batch: NestedBatch, fn: Callable[[Tensor], Tensor]) -> NestedBatch:
    """A batch whose stored tensors are ``fn`` of ``batch``'s (same structure and layout)."""
    return batch._map_primary(fn)


def with_ragged_dim(batch: NestedBatch, ragged_dim: int) -> NestedBatch:
    """The same data presented with the ragged dim at ``ragged_dim`` (shares the cache, so
    conversions made through either serve both)."""
    if ragged_dim == batch._ragged_dim:
        return batch
    out = NestedBatch(batch._primary, ragged_dim)
    out._cache, out._versions = batch._cache, batch._versions
    out._base_batch = batch._base_batch
    return out


def storage_dim(batch: NestedBatch, dim: int) -> tuple[str, int]:
    """Where logical ``dim`` (normalized) of ``batch`` is stored.

    Returns
    -------
    kind : str
        ``"batch"``, ``"ragged"`` or ``"feature"``.
    stored : int
        0 for the batch; for a ragged dim its dim in the padded data ``(B, *padded, *feature)``
        (``1..k``); for a feature dim its dim in the packed values ``(total, *feature)``.
    """
    if dim == 0:
        return "batch", 0
    k, ragged = batch.num_ragged_dims, batch.ragged_dim
    if k > 1:
        return ("ragged", dim) if dim <= k else ("feature", dim - k)
    if dim == ragged:
        return "ragged", 1
    # Stored feature dims are in logical order, with the ragged position skipped.
    return "feature", dim if dim < ragged else dim - 1


def moved_ragged_error(batch: NestedBatch, what: str, detail: str = "") -> ValueError:
    """The error of an op that cannot run with the ragged dim where ``batch`` presents it."""
    extra = f" ({detail})" if detail else ""
    return ValueError(
        f"{what} is not supported with the ragged dim at logical dim {batch.ragged_dim}{extra}; "
        f"transpose the ragged dim back to dim 1 first (e.g. x.transpose(1, {batch.ragged_dim}))"
    )

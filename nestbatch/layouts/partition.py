"""`RowPartition`: how the rows of a batch split into samples.

The vocabulary is TensorFlow's. A batch of ``B`` samples whose shapes are
``(*ragged_shape_i, *feature_shape)`` with ``k >= 1`` ragged dims is described by

* ``shape_per_sample`` ``(B, k)`` int64: the ragged shape of every sample (kaolin's
  ``shape_per_tensor``);
* ``lengths`` ``(B,)`` int64: the number of packed rows of every sample, the product of its ragged
  shape (TF ``row_lengths``);
* ``offsets`` ``(B + 1,)`` int64: where each sample starts in the packed rows (TF ``row_splits``,
  kaolin ``first_idx``);
* ``row_ids`` ``(total,)`` int64: the sample of every packed row (TF ``value_rowids``);
* ``positions`` ``(total,)`` int64: the index of every packed row inside its sample.

A partition is built from one of them (or, for ragged rank ``r >= 2``, from a chain of one-level
partitions, outermost first); the others are named caches derived on first use, so every layout
of a batch shares one partition and computes its metadata once. Host-side sizes are kept when
known (a batch built from a list, or with ``max_len`` given), so shapes of outputs are known
without reading device memory; when they exist only on the device, the first property that
needs them reads them once
(a device synchronization) and caches them.
"""

from __future__ import annotations

import array
import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from nestbatch.checks import HostSizes
from nestbatch.kernels.dispatch import making_fake_tensors
from nestbatch.kernels.torch_impl import sizes_mask
from nestbatch.layouts.memo import memoized


class RowPartition:
    """Per-sample ragged sizes of a batch, with lazily derived, cached metadata.

    The sizes come from one source, handed to a constructor: host lengths or shapes (Python ints,
    or a CPU tensor: no synchronization ever needed), device offsets (one ragged dim), device
    shapes ``(B, k)`` (:meth:`from_shapes`, ``RowPartition(shape_per_sample)``), or, for a batch
    of ragged rank ``r >= 2``, a chain of ``r`` one-level partitions (:meth:`nested`). Everything
    else (lengths, offsets, row ids, the mask, the maximum, ...) is a named cache derived from the
    source on first use, or handed over by the constructor when the caller already has it. What
    the host knows without reading the device says :attr:`knows_host_shapes`,
    :attr:`knows_max_shape`, :attr:`knows_total` and :attr:`host_has_empty`.

    Parameters
    ----------
    shape_per_sample : Tensor
        ``(B, k)`` int64, the ragged shape of every sample.
    host_shapes : tuple of tuple of int, optional
        The same shapes on the host, when the caller knows them (no synchronization needed then).
    max_shape : tuple of int, optional
        The per-dim maximum of the shapes on the host, when known without the full list.

    Notes
    -----
    Immutable: build a new partition to describe another batch. Prefer the constructors
    :meth:`from_lengths`, :meth:`from_offsets`, :meth:`from_shapes` and :meth:`from_host_shapes`.
    """

    def __init__(
        self,
        shape_per_sample: Tensor,
        *,
        host_shapes: tuple[tuple[int, ...], ...] | None = None,
        max_shape: tuple[int, ...] | None = None,
    ) -> None:
        if shape_per_sample.dim() != 2:
            raise ValueError(
                f"shape_per_sample must have shape (B, k), got {tuple(shape_per_sample.shape)}"
            )
        if shape_per_sample.shape[1] < 1:
            raise ValueError("a batch needs at least one ragged dim (k >= 1)")
        self._blank(*shape_per_sample.shape, shape_per_sample.device, max_shape, into=self)
        self._shapes = shape_per_sample.to(torch.int64)
        if host_shapes is not None:
            self._host_shapes = host_shapes
            self._sizes_on_host = True

    # Every field: the optional ones default here, the required ones are set by _blank; the
    # constructors then set what they know.
    _shapes: Tensor | None = None  # (B, k) on the device: given, or made on first use
    _host_shapes: tuple | None = None  # the shapes on the host: given, or read once
    _host_lengths_tensor: Tensor | None = None  # host lengths held in a CPU tensor
    # A flag, not a test of the caches: under torch.compile a membership test realizes the
    # whole ``__dict__`` and guards on its tuples' lengths.
    _sizes_on_host = False
    _has_empty: bool | None = None  # see host_has_empty
    _levels: tuple[RowPartition, ...] | None = None  # see nested
    _mask_source: Tensor | None = None  # (B, W): the sizes of from_sizes(mask=...)
    _masks: dict[tuple[int, ...], Tensor] | None = None  # the masks made, by padded shape
    _pinned_for_graphs: tuple[Tensor, ...] = ()  # host buffers a captured CUDA graph copies from

    @classmethod
    def _blank(cls, batch_size: int, num_ragged_dims: int, device: torch.device | str,
               max_shape: tuple[int, ...] | None = None, *,
               into: RowPartition | None = None) -> RowPartition:
        """A partition with the required fields set (the optional ones default in the class
        body), whose constructor records its sizes next: the one place fields are set up, and
        without ``__init__``'s checks (the hot path of every batch made from lengths or
        offsets). ``into``: the object to set them on (``__init__`` / ``__setstate__``'s own)."""
        partition = cls.__new__(cls) if into is None else into
        partition._batch_size = batch_size
        partition._num_ragged_dims = num_ragged_dims
        partition._device = device if type(device) is torch.device else torch.device(device)
        partition._max_shape = max_shape
        return partition

    def _seed(
        self, *, offsets: Tensor | None = None, host_offsets: tuple[int, ...] | None = None,
        host_lengths: tuple[int, ...] | None = None, lengths: Tensor | None = None,
        total: int | None = None, row_ids: Tensor | None = None,
        lengths_shaped: Tensor | None = None, mask_shaped: Tensor | None = None,
    ) -> None:
        """Give the caches of these names the values a constructor has (None: not known); the
        one place that fills them but their first use. Named parameters: ``**caches`` cost more
        than the rest of a partition's set-up (this runs on every batch built)."""
        if offsets is not None:
            self.offsets = offsets
        if host_offsets is not None:
            self.host_offsets = host_offsets
        if host_lengths is not None:
            self.host_lengths = host_lengths
        if lengths is not None:
            self.lengths = lengths
        if total is not None:
            self.total = total
        if row_ids is not None:
            self.row_ids = row_ids
        if lengths_shaped is not None:
            self.lengths_shaped = lengths_shaped
        if mask_shaped is not None:
            self.mask_shaped = mask_shaped

    # ----------------------------------------------------------------------------- constructors
    @classmethod
    def from_host_shapes(
        cls, shapes: Sequence[Sequence[int]], num_ragged_dims: int, device: torch.device, *,
        offsets: Tensor | None = None,
    ) -> RowPartition:
        """Partition from ragged shapes known on the host (no synchronization ever needed).

        No device tensor is made here: the device metadata is copied from the host sizes on
        first use (one small host-to-device copy per kind of metadata, then cached).
        ``offsets``: the same sizes' offsets on the device, when the caller has them (kaolin's
        ``first_idx``).
        """
        host = tuple(tuple(map(int, shape)) for shape in shapes)
        partition = cls._blank(len(host), int(num_ragged_dims), device)
        partition._host_shapes = host
        partition._sizes_on_host = True
        partition._seed(offsets=offsets)
        return partition

    @classmethod
    def from_host_lengths(
        cls, lengths: Sequence[int], device: torch.device, *, max_len: int | None = None,
        total: int | None = None, traceable: bool = False, as_tensor: Tensor | None = None,
    ) -> RowPartition:
        """Partition of a batch with one ragged dim whose lengths (Python ints) are known on the
        host; ``max_len``, when given, at least the largest, ``total`` their sum. No pass over
        the lengths beyond a tuple copy: the rest is derived on first use. ``traceable=True``
        (with ``max_len`` and ``total``) makes the offsets now (one small host-to-device copy):
        a function that ``torch.compile`` traces then reads the sizes from the offsets tensor,
        of dynamic length, and two ints, never from the tuple it would specialize on (one graph
        per batch size). ``as_tensor``: the lengths in an int64 host tensor, if a caller has one
        (:meth:`from_host_sizes` takes their offsets as bytes).
        """
        lengths = tuple(lengths)
        partition = cls._blank(len(lengths), 1, device, None if max_len is None else (max_len,))
        partition._sizes_on_host = True
        partition._host_lengths_tensor = as_tensor
        if not traceable:
            partition._seed(host_lengths=lengths, total=total)
        elif len(lengths) > _FEW_SIZES or making_fake_tensors():
            partition._seed(host_lengths=lengths, total=total)
            partition._seed(offsets=partition._host_offsets(torch.int64))
        else:  # _host_offsets' case of few sizes, inline: every small batch takes it
            host = (0, *itertools.accumulate(lengths))
            host_tensor = torch.frombuffer(array.array("q", host), dtype=torch.int64)
            offsets = partition._to_device(host_tensor)
            partition._seed(host_lengths=lengths, total=total, host_offsets=host, offsets=offsets)
        return partition

    @classmethod
    def from_host_sizes(cls, host: HostSizes, device: torch.device, max_len: int
                        ) -> RowPartition:
        """:meth:`from_host_lengths` with ``traceable=True`` from checked host lengths
        (:func:`~nestbatch.checks.checked_host_sizes`; ``max_len`` at least the largest): where
        one C pass read them, the offsets tensor is one ``frombuffer`` of its bytes. Positional:
        every batch built from host lengths comes here, and keyword arguments cost more than
        the rest of the set-up."""
        if host.offsets is None:  # (read in Python: fake tensors, or no C module)
            return cls.from_host_lengths(host.sizes, device, max_len=max_len, total=host.total,
                                         traceable=True, as_tensor=host.as_tensor)
        # No fake-tensor test: the C pass does not run while fake tensors are made.
        partition = cls._blank(len(host.sizes), 1, device, (max_len,))
        partition._sizes_on_host = True
        offsets = torch.frombuffer(host.offsets, dtype=torch.int64)
        if partition._device != _HOST:  # (_to_device's own first test: no frame on the host)
            offsets = partition._to_device(offsets)
        partition._seed(host_lengths=host.sizes, total=host.total, offsets=offsets)
        return partition

    @classmethod
    def from_host_lengths_tensor(
        cls, lengths: Tensor, device: torch.device, *, max_len: int | None = None
    ) -> RowPartition:
        """:meth:`from_host_lengths` from lengths held in a 1-d int64 CPU tensor (read without
        a sync), kept as it is: the tuple :attr:`host_lengths`, the total, the maximum and the
        offsets are derived from it on first use, at C speed (thousands of samples cost a few
        microseconds instead of a list of Python ints). Not checked: the caller vouches for the
        lengths (non-negative; ``max_len``, when given, the largest)."""
        partition = cls._blank(lengths.shape[0], 1, device, None if max_len is None else (max_len,))
        partition._sizes_on_host = True
        partition._host_lengths_tensor = lengths
        return partition

    @classmethod
    def from_host_shape_tensor(cls, shapes: Tensor, device: torch.device) -> RowPartition:
        """Partition of data on ``device`` from ``(B, k)`` int64 shapes held in a CPU tensor
        (read without a sync; the caller has checked them): the host keeps the sizes."""
        if shapes.shape[1] == 1:
            return cls.from_host_lengths_tensor(shapes[:, 0].contiguous(), device)
        return cls.from_host_shapes(shapes.tolist(), shapes.shape[1], device)

    @classmethod
    def from_lengths(cls, lengths: Tensor, *, host_lengths: Sequence[int] | None = None,
                     max_len: int | None = None) -> RowPartition:
        """Partition of a batch with one ragged dim, from its lengths ``(B,)``."""
        host = None if host_lengths is None else tuple((int(n),) for n in host_lengths)
        max_shape = None if max_len is None else (_size(max_len),)
        return cls(lengths.reshape(-1, 1), host_shapes=host, max_shape=max_shape)

    @classmethod
    def from_offsets(
        cls, offsets: Tensor, *, max_len: int | None = None, total: int | None = None,
        row_ids: Tensor | None = None,
    ) -> RowPartition:
        """Partition of a batch with one ragged dim, from its offsets ``(B + 1,)`` (int32 or
        int64; kept as given). The lengths are derived on first use; ``row_ids``: the sample of
        every row, when the caller has them (TF's ``value_rowids``)."""
        if max_len is None or type(max_len) is int:  # (the common cases: no frame)
            max_shape = None if max_len is None else (max_len,)
        else:
            max_shape = (_size(max_len),)
        partition = cls._blank(offsets.shape[0] - 1, 1, offsets.device, max_shape)
        if total is not None and type(total) is not int:
            total = int(total)
        partition._seed(offsets=offsets, total=total, row_ids=row_ids)
        return partition

    @classmethod
    def from_shapes(
        cls, shape_per_sample: Tensor, *, max_shape: Sequence[int] | None = None,
        offsets: Tensor | None = None,
    ) -> RowPartition:
        """Partition from per-sample ragged shapes ``(B, k)`` held on the device; ``offsets``:
        their offsets, when the caller has them (kaolin's ``first_idx``)."""
        partition = cls(shape_per_sample, max_shape=None if max_shape is None else tuple(max_shape))
        partition._seed(offsets=offsets)
        return partition

    @classmethod
    def from_sizes(cls, lengths: Tensor | None = None, mask: Tensor | None = None
                   ) -> RowPartition:
        """Partition of a batch with one ragged dim held on the device as ``lengths`` (any
        integer dtype) and / or a prefix ``mask`` ``(..., W)``, both in a batch shape of one or
        more dims that the partition flattens (``B`` samples: their product); the lengths are
        counted from the mask when not given. Both are kept as given. Not checked: the caller
        vouches that they agree (the ``RaggedBatch`` API's contract); :meth:`lengths_in` /
        :meth:`mask_in` return them."""
        if lengths is not None and lengths.dim() == 1:  # (the common case, on every batch)
            partition = cls._blank(lengths.shape[0], 1, lengths.device)
            partition._seed(lengths_shaped=lengths, mask_shaped=mask, lengths=lengths)
        else:
            given = lengths if lengths is not None else mask
            dims = given.shape if lengths is not None else given.shape[:-1]
            partition = cls._blank(math.prod(dims), 1, given.device)
            flat = None if lengths is None else lengths.reshape(-1)
            partition._seed(lengths_shaped=lengths, mask_shaped=mask, lengths=flat)
        if mask is not None:
            flat = mask if mask.dim() == 2 else mask.reshape(partition.batch_size, mask.shape[-1])
            partition._masks = {(mask.shape[-1],): flat}
            if lengths is None:
                partition._mask_source = flat
        return partition

    @property
    def lengths_as_given(self) -> Tensor | None:
        """The sizes tensor :meth:`from_sizes` was given (or :meth:`lengths_in` made), in its
        batch shape; None if there is none yet."""
        return self.__dict__.get("lengths_shaped")

    @property
    def mask_as_given(self) -> Tensor | None:
        """The mask :meth:`from_sizes` was given (or :meth:`mask_in` made), in its batch shape;
        None if there is none yet."""
        return self.__dict__.get("mask_shaped")

    def lengths_in(self, batch_shape: Sequence[int]) -> Tensor:
        """:attr:`lengths` in a batch shape of one or more dims (whose product is ``B``): the
        tensor :meth:`from_sizes` was given, or one view made once."""
        return self._shaped("lengths_shaped", self.lengths, tuple(batch_shape))

    def mask_in(self, batch_shape: Sequence[int], width: int) -> Tensor:
        """The mask of padded width ``width`` in a batch shape (see :meth:`lengths_in`)."""
        sizes = self.lengths_as_given
        if sizes is not None and sizes.shape == batch_shape and self._levels is None \
                and "mask_shaped" not in self.__dict__:
            flat = sizes_mask(sizes, width)  # already in the batch shape: two ops
        else:
            flat = self.mask((width,))
        return self._shaped("mask_shaped", flat, (*batch_shape, width))

    def _shaped(self, name: str, flat: Tensor, shape: tuple[int, ...]) -> Tensor:
        kept = self.__dict__.get(name)
        if kept is not None and kept.shape == shape:
            return kept
        shaped = flat if flat.shape == shape else flat.reshape(shape)
        if not torch.compiler.is_compiling():
            self._seed(**{name: shaped})
        return shaped

    @classmethod
    def nested(cls, levels: Sequence[RowPartition]) -> RowPartition:
        """The partition of a batch of ragged rank ``r = len(levels) >= 2`` (TF's nested row
        partitions; documents of sentences of words).

        Level 1 partitions the samples into rows, level ``j`` the rows of level ``j - 1`` into
        rows (every level one ragged dim), the last one the rows of the packed values. The
        batch's own sizes (:attr:`lengths`, :attr:`offsets`, :attr:`row_ids`) are those of the
        values: every sample's innermost rows, back to back. :attr:`max_shape` holds every
        level's longest row, :attr:`ragged_index` the position of every value at every level.
        """
        levels = tuple(levels)
        if len(levels) < 2 or any(level.num_ragged_dims != 1 for level in levels):
            raise ValueError("a nested partition chains two or more one-ragged-dim partitions")
        partition = cls._blank(levels[0].batch_size, len(levels), levels[0].device)
        partition._levels = levels
        partition._sizes_on_host = all(level.knows_host_shapes for level in levels)
        return partition

    # ------------------------------------------------------------------------------- basic facts
    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        return self._batch_size

    @property
    def num_ragged_dims(self) -> int:
        """Number of ragged dims ``k`` (for nested raggedness, the ragged rank)."""
        return self._num_ragged_dims

    @property
    def ragged_rank(self) -> int:
        """The number of nested levels (TF's ``ragged_rank``): 1 unless :attr:`levels` has more
        (a batch of rectangular samples ragged in ``k`` dims has one level)."""
        return 1 if self._levels is None else len(self._levels)

    @property
    def levels(self) -> tuple[RowPartition, ...]:
        """The one-ragged-dim partitions of every level, outermost first (``(self,)`` unless
        nested)."""
        return (self,) if self._levels is None else self._levels

    @property
    def device(self) -> torch.device:
        """Device of the metadata tensors."""
        return self._device

    @property
    def shape_per_sample(self) -> Tensor:
        """``(B, k)`` int64: the ragged shape of every sample (made on first use, then cached:
        a copy of the host sizes, or a view of :attr:`lengths` for one ragged dim).

        Raises
        ------
        ValueError
            For nested raggedness: a sample's rows differ in length, it has no one shape.
        """
        if self._shapes is None:
            self._require_rectangular("shape_per_sample")
            if self.num_ragged_dims == 1:
                self._shapes = self.lengths.view(-1, 1)
            else:
                flat = list(itertools.chain.from_iterable(self.host_shapes))
                self._shapes = self._host_tensor(flat).view(-1, self.num_ragged_dims)
        return self._shapes

    def _require_rectangular(self, what: str) -> None:
        if self._levels is not None:
            raise ValueError(
                f"{what}: a batch of ragged rank {len(self._levels)} has rows of different "
                "lengths inside a sample, so no per-sample shape; see the partition's levels"
            )

    def _host_tensor(self, values: Sequence, dtype: torch.dtype = torch.int64, *,
                     fake: bool | None = None) -> Tensor:
        """A tensor of host ints on the partition's device: one host-to-device copy.

        The tensor wraps an ``array`` of the values (1 us instead of ``torch.tensor``'s 4 for a
        few values, 80 us instead of 600 for 4096), except while tracing with fake tensors,
        which need a factory op (``fake``: :func:`making_fake_tensors`, when the caller knows).
        """
        if not values or (making_fake_tensors() if fake is None else fake):
            # Made on the host and copied (not ``torch.tensor(..., device=)``, whose copy on a
            # CUDA build of torch runs below the dispatcher, hidden from tracing modes).
            return torch.tensor(values, dtype=dtype).to(self._device)
        code = "q" if dtype == torch.int64 else "i"
        return self._to_device(torch.frombuffer(array.array(code, values), dtype=dtype))

    def _to_device(self, host: Tensor) -> Tensor:
        """``host`` (a CPU tensor made here) on the partition's device, without a sync.

        The copy is asynchronous: from pageable memory the CUDA runtime stages the bytes before
        the call returns, so the host tensor may go. Under CUDA-graph capture the bytes come
        from pinned memory instead (the only kind a graph can copy from); the partition keeps
        that buffer alive for the graph's replays.
        """
        if self._device == _HOST:  # (``device.type`` costs 0.3 us: this runs on every batch)
            return host
        if self._device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            host = host.pin_memory()
            self._pinned_for_graphs = (*self._pinned_for_graphs, host)
        return host.to(self._device, non_blocking=True)

    @property
    def knows_host_shapes(self) -> bool:
        """Whether the per-sample sizes are known on the host (no sync needed to read them)."""
        return self._sizes_on_host

    @property
    def cached_max_shape(self) -> tuple[int, ...] | None:
        """:attr:`max_shape` when it is already known (given, or computed before), else None:
        reading this never computes it."""
        return self._max_shape

    @property
    def knows_max_shape(self) -> bool:
        """Whether :attr:`max_shape` is known on the host (no sync needed to read it)."""
        return self._max_shape is not None or self._sizes_on_host

    # ---------------------------------------------------------------------- derived, on the host
    @property
    def host_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Per-sample ragged shapes on the host.

        Synchronizes with the device once when the shapes were only known there.
        """
        if self._host_shapes is None:
            self._require_rectangular("host_shapes")
            if self._sizes_on_host and self.num_ragged_dims == 1:
                shapes = tuple(zip(self.host_lengths))
            else:
                shapes = tuple(tuple(row) for row in self.shape_per_sample.tolist())
            if torch.compiler.is_compiling():
                return shapes  # (a traced graph keeps no state on the partition)
            self._host_shapes, self._sizes_on_host = shapes, True
        return self._host_shapes

    @memoized
    def host_lengths(self) -> tuple[int, ...]:
        """Number of packed rows of every sample, on the host (may synchronize once)."""
        if self._levels is not None:
            # Every sample's values: the rows of each level summed up per sample, level by level.
            counts = self._levels[-1].host_lengths
            for level in reversed(self._levels[:-1]):
                offsets = level.host_offsets
                counts = tuple(sum(counts[a:b]) for a, b in zip(offsets, offsets[1:]))
            return counts
        if self._host_shapes is None and self._host_lengths_tensor is not None:
            return tuple(self._host_lengths_tensor.tolist())  # a host tensor: no sync
        if self._num_ragged_dims == 1:
            return tuple(shape[0] for shape in self.host_shapes)
        return tuple(math.prod(shape) for shape in self.host_shapes)

    def clamped(self, stop: int) -> RowPartition:
        """The partition of ``x[:, :stop]`` for one ragged dim whose lengths the host knows:
        every length above ``stop`` cut to ``stop``. Itself when no sample is longer; at C
        speed for many lengths already read into a host tensor (they stay in one)."""
        if self.max_shape[0] <= stop:  # (the host knows the lengths: no sync)
            return self
        if self._host_lengths_tensor is not None:
            lengths = self._host_lengths_tensor.clamp(max=stop)  # a host tensor: no sync
            return RowPartition.from_host_lengths_tensor(lengths, self._device, max_len=stop)
        lengths = [n if n < stop else stop for n in self.host_lengths]
        return RowPartition.from_host_lengths(lengths, self._device, max_len=stop)

    @memoized
    def host_offsets(self) -> tuple[int, ...]:
        """Start of every sample in the packed rows, then the total, on the host (may sync once)."""
        return (0, *itertools.accumulate(self.host_lengths))

    @property
    def max_shape(self) -> tuple[int, ...]:
        """Per-dim maximum of the ragged shapes (0 for an empty batch), on the host; for nested
        raggedness, every level's longest row.

        Synchronizes with the device once when neither the shapes nor their maximum are known on
        the host.
        """
        if self._max_shape is None:
            value = self._find_max_shape()
            if torch.compiler.is_compiling():
                return value  # (a traced graph keeps no state on the partition)
            self._max_shape = value
        return self._max_shape

    def _find_max_shape(self) -> tuple[int, ...]:
        if self._levels is not None:
            return tuple(level.max_shape[0] for level in self._levels)
        if self._sizes_on_host and self.num_ragged_dims == 1 and self._host_shapes is None:
            read = self._host_lengths_tensor  # a host tensor, when there is one: no sync
            if read is not None:
                return (int(read.max()) if read.numel() else 0,)
            return (max(self.host_lengths, default=0),)
        if self._host_shapes is not None or self.batch_size == 0:
            shapes = self.host_shapes
            return tuple(map(max, zip(*shapes))) if shapes else (0,) * self.num_ragged_dims
        return tuple(self.shape_per_sample.amax(0).tolist())

    @memoized
    def total(self) -> int:
        """Total number of packed rows, on the host (may synchronize once)."""
        if self._levels is not None:
            return self._levels[-1].total
        if self.knows_host_shapes:
            if self._host_lengths_tensor is not None:
                return int(self._host_lengths_tensor.sum())  # a host tensor: no sync
            return sum(self.host_lengths)
        return int(self.offsets[-1])

    @property
    def knows_total(self) -> bool:
        """Whether :attr:`total` is known on the host (no sync needed to read it)."""
        if self._levels is not None:
            return self._levels[-1].knows_total
        return self.knows_host_shapes or "total" in self.__dict__

    @property
    def host_has_empty(self) -> bool | None:
        """Whether some sample has no element, when the host knows it or reads it without a
        sync (offsets in host memory); None otherwise, and while ``torch.compile`` traces,
        which would specialize its graph on every length. Cached in a private attribute that
        traced code never reads (a memoized value in the instance dict would be guarded on)."""
        if torch.compiler.is_compiling():
            return None
        if self._has_empty is None:
            if self.knows_host_shapes:
                self._has_empty = 0 in self.host_lengths
            elif self._device == _HOST and self._levels is None:  # (no device offsets made)
                self._has_empty = _has_equal_neighbours(self.offsets)
        return self._has_empty

    # -------------------------------------------------------------------- derived, on the device
    # Each is computed once, with as few device ops as the known sizes allow: host sizes are
    # copied once; offsets given on the device are differenced, never read back.
    @memoized
    def lengths(self) -> Tensor:
        """``(B,)`` int64: packed rows per sample, the product of each ragged shape."""
        if self._mask_source is not None:  # built from a mask alone: its rows counted
            return self._mask_source.sum(-1, dtype=torch.int64)
        if "offsets" in self.__dict__ or (self._shapes is None and (
                self.num_ragged_dims == 1 or self._levels is not None)):
            return self.offsets.diff().to(torch.int64)
        if self.num_ragged_dims == 1:
            return self._shapes[:, 0]
        return self.shape_per_sample.prod(1)

    @memoized
    def offsets(self) -> Tensor:
        """``(B + 1,)`` int64 (or the int32 offsets the batch was built from): start of every
        sample in the packed rows, then the total."""
        if self.knows_host_shapes:
            return self._host_offsets(torch.int64)
        if self._levels is not None:
            # Every level's offsets index the next level's: composed, they index the values.
            offsets = self._levels[0].offsets
            for level in self._levels[1:]:
                offsets = level.offsets[offsets]
            return offsets
        offsets = self.lengths.new_empty(self.batch_size + 1)
        offsets[:1] = 0
        torch.cumsum(self.lengths, 0, out=offsets[1:])
        return offsets

    @memoized
    def offsets32(self) -> Tensor:
        """:attr:`offsets` as int32 (what the varlen attention kernels take), made once: copied
        from the host sizes when known, else cast from the device offsets."""
        if self.knows_host_shapes and "offsets" not in self.__dict__:
            return self._host_offsets(torch.int32)
        return self.offsets.to(torch.int32)

    def _host_offsets(self, dtype: torch.dtype) -> Tensor:
        """The offsets from the host lengths, on the device: one host-to-device copy. Many
        lengths are summed by torch on the host (C speed) rather than by Python."""
        fake = making_fake_tensors()
        if self._batch_size <= _FEW_SIZES or fake:
            return self._host_tensor(self.host_offsets, dtype, fake=fake)
        read = self._host_lengths_tensor
        if read is None:
            read = torch.frombuffer(array.array("q", self.host_lengths), dtype=torch.int64)
        host = torch.zeros(self._batch_size + 1, dtype=dtype)
        torch.cumsum(read, 0, dtype=dtype, out=host[1:])
        return self._to_device(host)

    @memoized
    def empty_samples(self) -> Tensor:
        """``(B,)`` bool: which samples have no element."""
        return self.lengths == 0

    @memoized
    def row_ids(self) -> Tensor:
        """``(total,)`` int64: the sample every packed row belongs to."""
        return torch.repeat_interleave(self.lengths, output_size=self.total)

    @memoized
    def positions(self) -> Tensor:
        """``(total,)`` int64: the index of every packed row inside its sample."""
        rows = torch.arange(self.total, device=self.device)
        return rows - self.offsets[self.row_ids]

    @memoized
    def ragged_index(self) -> tuple[Tensor, ...]:
        """``k`` tensors ``(total,)``: the multi-index of every packed row in its sample's shape.

        The packed rows of a sample are its ragged dims flattened in row-major order, so the
        multi-index is the unravelled position. For nested raggedness: the position of every
        value in its row at every level, outermost first.
        """
        if self.num_ragged_dims == 1:
            return (self.positions,)
        if self._levels is not None:
            index, row = [], None
            for level in reversed(self._levels):
                index.append(level.positions if row is None else level.positions[row])
                row = level.row_ids if row is None else level.row_ids[row]
            return tuple(reversed(index))
        rest = self.positions
        shapes = self.shape_per_sample[self.row_ids]
        index = []
        for d in range(self.num_ragged_dims - 1, 0, -1):
            size = shapes[:, d].clamp_min(1)
            index.append(rest % size)
            rest = rest // size
        index.append(rest)
        return tuple(reversed(index))

    def mask(self, padded_shape: Sequence[int] | None = None) -> Tensor:
        """``(B, *padded_shape)`` bool: True where a padded slot holds a sample's element (for
        nested raggedness: where it holds a value, every level's row long enough).

        Parameters
        ----------
        padded_shape : sequence of int, optional
            Size of every ragged dim of the padded data; defaults to :attr:`max_shape`.
        """
        padded_shape = self.max_shape if padded_shape is None else tuple(padded_shape)
        if torch.compiler.is_compiling():  # (a traced graph neither reads nor keeps the cache)
            return self._make_mask(padded_shape)
        if self._masks is None:
            self._masks = {}
        mask = self._masks.get(padded_shape)
        if mask is None:
            mask = self._masks[padded_shape] = self._make_mask(padded_shape)
        return mask

    def cached_mask(self, padded_shape: Sequence[int]) -> Tensor | None:
        """The mask of ``padded_shape`` when it was given or made before, else None: reading
        this never computes it."""
        return None if self._masks is None else self._masks.get(tuple(padded_shape))

    def _make_mask(self, padded_shape: tuple[int, ...]) -> Tensor:
        if self._levels is not None:
            return self._nested_mask(padded_shape)
        k = self.num_ragged_dims
        if k == 1:
            return sizes_mask(self.lengths, padded_shape[0])
        mask = None
        for d, size in enumerate(padded_shape):
            view = [self.batch_size] + [1] * k
            view[d + 1] = size
            in_range = sizes_mask(self.shape_per_sample[:, d], size).view(view)
            mask = in_range if mask is None else mask & in_range
        return mask.expand(self.batch_size, *padded_shape)

    def _nested_mask(self, padded_shape: tuple[int, ...]) -> Tensor:
        # Level by level: a slot holds a row when its parent does and the parent row is long
        # enough; ``row`` is the row of the level every slot stands for.
        first = self._levels[0]
        width = padded_shape[0]
        mask = sizes_mask(first.lengths, width)
        row = first.offsets[:-1, None] + torch.arange(width, device=self._device)
        for level, width in zip(self._levels[1:], padded_shape[1:]):
            if level.batch_size == 0:
                return mask.new_zeros((*mask.shape, *padded_shape[mask.dim() - 1:]))
            row = row.clamp(max=level.batch_size - 1)
            inside = sizes_mask(level.lengths[row].reshape(-1), width).view(*row.shape, width)
            mask = mask.unsqueeze(-1) & inside
            row = level.offsets[:-1][row].unsqueeze(-1) + torch.arange(width, device=self._device)
        return mask

    def note_total(self, total: int) -> None:
        """Record the total number of rows when a caller knows it on the host (saves a sync)."""
        if "total" not in self.__dict__:
            self._seed(total=int(total))

    # --------------------------------------------------------------------------------- transforms
    def to(self, device: torch.device | str) -> RowPartition:
        """The same partition with its tensors on ``device`` (host-side sizes are kept)."""
        if device == self._device:  # the common case, without building a device object
            return self
        device = torch.device(device)
        if device == self._device:
            return self
        if self._levels is not None:
            return RowPartition.nested([level.to(device) for level in self._levels])
        if self._sizes_on_host and self._host_shapes is None:
            moved = RowPartition.from_host_lengths(self.host_lengths, device)
        elif self._host_shapes is not None:
            moved = RowPartition.from_host_shapes(self._host_shapes, self.num_ragged_dims, device)
        else:
            return RowPartition(self.shape_per_sample.to(device), max_shape=self._max_shape)
        moved._max_shape = self._max_shape
        return moved

    def select(self, index: Tensor, host_index: list[int] | None = None) -> RowPartition:
        """Partition of the samples ``index`` (1-d int64, in range, on any device);
        ``host_index``: the same indices as a list, when the caller has them.

        Host-side shapes carry over when ``index`` is a CPU tensor (no synchronization).
        """
        if self._levels is not None:
            levels = []  # every level keeps the rows under the selected ones, in order
            for level in self._levels:
                levels.append(level.select(index, host_index))
                index, host_index = level.rows_under(index, host_index)
            return RowPartition.nested(levels)
        if self.knows_host_shapes and (host_index is not None or index.is_cpu):
            # ``index`` is a host tensor when the list is not given: reading it is no sync.
            host_index = index.tolist() if host_index is None else host_index
            if self._num_ragged_dims == 1:
                lengths = self.host_lengths
                return RowPartition.from_host_lengths([lengths[i] for i in host_index],
                                                      self._device)
            host = tuple(self.host_shapes[i] for i in host_index)
            return RowPartition.from_host_shapes(host, self._num_ragged_dims, self._device)
        return RowPartition(self.shape_per_sample[index.to(self.device)])

    def rows_under(self, index: Tensor, host_index: list[int] | None = None
                   ) -> tuple[Tensor, list[int] | None]:
        """The packed rows of the samples ``index`` (one ragged dim), in order, as a tensor on
        the partition's device and, with host sizes, as a list (no sync); with device sizes the
        count is read once (the output's size needs it)."""
        if self.knows_host_shapes and (host_index is not None or index.is_cpu):
            host_index = index.tolist() if host_index is None else host_index
            offsets = self.host_offsets
            rows = [r for i in host_index for r in range(offsets[i], offsets[i + 1])]
            return torch.tensor(rows, dtype=torch.int64), rows
        index = index.to(self._device)
        chosen = RowPartition(self.lengths[index].view(-1, 1))  # (its total: the one read)
        starts = self.offsets[:-1][index].to(torch.int64)
        return starts[chosen.row_ids] + chosen.positions, None

    def __getstate__(self) -> dict:
        # Derived tensors are cheap to recompute; pickling only the source keeps payloads small.
        known = self.knows_host_shapes and self._levels is None
        blank = RowPartition._blank(self._batch_size, self._num_ragged_dims, self._device,
                                    self._max_shape)
        state = {
            **vars(blank),
            "_shapes": None if known else self._shapes,
            "_host_shapes": self.host_shapes if known else None,
            "_sizes_on_host": self._sizes_on_host,
            "_levels": self._levels,
        }
        if self._shapes is None and not self._sizes_on_host and self._levels is None:
            # Sizes only on the device: the offsets (else the lengths), and the sizes and mask
            # as they were given.
            if "offsets" not in self.__dict__:
                state["lengths"] = self.lengths
            for name in ("offsets", "lengths_shaped", "mask_shaped"):
                if name in self.__dict__:
                    state[name] = self.__dict__[name]
        return state

    def __setstate__(self, state: dict) -> None:
        # Partitions pickled before the nested levels lack the newer fields (they default) and
        # had a "lengths on host" flag instead.
        state.setdefault("_sizes_on_host", state.get("_host_shapes") is not None)
        state.pop("_lengths_on_host", None)
        self._blank(state["_batch_size"], state["_num_ragged_dims"], state["_device"], into=self)
        self.__dict__.update(state)

    def __repr__(self) -> str:
        if self._levels is not None:
            return f"RowPartition(batch_size={self.batch_size}, ragged_rank={self.ragged_rank})"
        shapes = self.host_shapes if self.knows_host_shapes else "<on device>"
        return f"RowPartition(batch_size={self.batch_size}, shapes={shapes})"


_HOST = torch.device("cpu")

#: Up to this many host sizes, Python builtins sum them faster than a round trip through torch.
_FEW_SIZES = 64


def _has_equal_neighbours(offsets: Tensor) -> bool | None:
    """Whether ``offsets`` ``(B + 1,)`` in host memory hold an empty sample (two equal
    neighbours): in Python for few, by three tensor ops for many. The ``tolist()`` and the
    ``bool()`` are no syncs: only a CPU tensor is read. ``None`` for a tensor elsewhere (reading
    it would be a sync) and for fake tensors, which hold no values."""
    if type(offsets) is not Tensor or not offsets.is_cpu:
        return None
    if offsets.shape[0] <= _FEW_SIZES:
        read = offsets.tolist()
        return any(a == b for a, b in zip(read, read[1:]))
    return bool((offsets[1:] == offsets[:-1]).any())


def _size(value: object) -> int | torch.SymInt:
    """A size as an int; a symbolic size of a graph being traced stays symbolic (``int()``
    would specialize the graph on its current value)."""
    return value if isinstance(value, torch.SymInt) else int(value)



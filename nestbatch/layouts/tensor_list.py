"""`TensorList`: a batch kept as a Python list of sample tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from nestbatch.checks import (
    check_same_feature_shape,
    check_tensor_sequence,
    common_dtype_device,
    normalize_empty_samples,
)
from nestbatch.layouts.base import RaggedLayout
from nestbatch.layouts.partition import RowPartition


class TensorList(RaggedLayout):
    """A ragged batch as a list of ``B`` tensors of shape ``(*ragged_shape_i, *feature)``.

    Parameters
    ----------
    tensors : sequence of Tensor
        The samples. They are kept as given (no copy) unless ``dtype`` / ``device`` convert them.
    num_ragged_dims : int, default 1
        How many leading dims of every sample are ragged.
    dtype, device : optional
        Convert every sample; required when the samples' dtypes or devices differ.
    feature_shape : sequence of int, optional
        Feature shape of an empty batch (ignored otherwise; defaults to ``()``).

    Notes
    -----
    A sample with no element counts as a zero-size sample whatever its shape, dtype or device
    (``torch.tensor([])`` or ``torch.tensor([[]])`` beside ``(n, 4)`` samples is a ``(0, 4)``
    sample); see :func:`nestbatch.checks.normalize_empty_samples`.

    Raises
    ------
    ValueError
        If the samples differ in number of dims or feature shape, or sit on mixed devices.
    TypeError
        If an element is not a tensor, or the samples have mixed dtypes without ``dtype=``.
    """

    def __init__(
        self,
        tensors: Sequence[Tensor],
        num_ragged_dims: int = 1,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        feature_shape: Sequence[int] = (),
        partition: RowPartition | None = None,
    ) -> None:
        check_tensor_sequence(tensors, items=False)  # (items: by common_dtype_device)
        if not isinstance(num_ragged_dims, int) or isinstance(num_ragged_dims, bool):
            raise TypeError(
                f"num_ragged_dims must be an int, got {type(num_ragged_dims).__name__} "
                f"({num_ragged_dims!r})"
            )
        if num_ragged_dims < 1:
            raise ValueError(f"num_ragged_dims must be >= 1, got {num_ragged_dims}")
        uniform = _uniform_samples(tensors, num_ragged_dims, dtype, device)
        if uniform is not None:  # the common case: nothing to normalize or convert
            dtype, device, shapes = uniform
        else:
            tensors = normalize_empty_samples(tensors, num_ragged_dims)
            dtype, device = common_dtype_device(tensors, dtype, device, "tensors")
            tensors = [
                t if t.dtype == dtype and t.device == device else t.to(device=device, dtype=dtype)
                for t in tensors
            ]
            shapes = [t.shape for t in tensors]
            check_same_feature_shape(shapes, num_ragged_dims, "tensors")
        if partition is None:
            partition = _partition_of(shapes, num_ragged_dims, device)
        self.tensors = tuple(tensors)
        self.partition = partition
        self._dtype = dtype
        self._feature_shape = (
            tensors[0].shape[num_ragged_dims:] if tensors else torch.Size(feature_shape)
        )

    @property
    def feature_shape(self) -> torch.Size:
        """Shape of the regular dims after the ragged ones."""
        return self._feature_shape

    @property
    def dtype(self) -> torch.dtype:
        """Element dtype."""
        return self._dtype

    @property
    def recorded_by_autograd(self) -> bool:
        """Whether a stored tensor has a ``grad_fn`` (see :class:`RaggedLayout`)."""
        return any(t.grad_fn is not None for t in self.tensors)

    def __getitem__(self, i: int) -> Tensor:
        return self.tensors[i]

    def __iter__(self):
        return iter(self.tensors)


_PLAIN_TENSOR = {Tensor}


def _uniform_samples(
    tensors: Sequence[object], num_ragged_dims: int, dtype: torch.dtype | None,
    device: torch.device | str | None,
) -> tuple[torch.dtype, torch.device, list[torch.Size]] | None:
    """``(dtype, device, shapes)`` of samples that need nothing normalized or converted: all
    plain tensors (not subclasses), of one dtype and device (those asked for, if any), with the
    same number of dims (at least ``num_ragged_dims``) and the same feature shape. ``None``
    otherwise: the general path then normalizes, converts, or explains what is wrong.

    Each test is one pass over the samples (set comprehensions, which ``torch.compile`` traces:
    it cannot call ``operator.attrgetter`` objects, and they are no faster): a list of 1000
    samples costs about 0.4 ms here, per-sample validation several.
    """
    if not tensors or not set(map(type, tensors)) <= _PLAIN_TENSOR:  # (subclasses: general path)
        return None
    dtypes, devices = {t.dtype for t in tensors}, {t.device for t in tensors}
    if len(dtypes) != 1 or len(devices) != 1:
        return None
    (common_dtype,), (common_device,) = dtypes, devices
    if (dtype is not None and dtype != common_dtype) or (
        device is not None and torch.device(device) != common_device
    ):
        return None
    shapes = [t.shape for t in tensors]
    ndims = set(map(len, shapes))
    if len(ndims) != 1 or min(ndims) < num_ragged_dims:
        return None
    for dim in range(num_ragged_dims, min(ndims)):  # one feature dim at a time: ints, no slices
        if len({shape[dim] for shape in shapes}) != 1:
            return None
    return common_dtype, common_device, shapes


def _partition_of(
    shapes: Sequence[torch.Size], num_ragged_dims: int, device: torch.device
) -> RowPartition:
    """The partition of samples of ``shapes``, known on the host."""
    if num_ragged_dims == 1:
        return RowPartition.from_host_lengths([shape[0] for shape in shapes], device)
    ragged = [shape[:num_ragged_dims] for shape in shapes]
    return RowPartition.from_host_shapes(ragged, num_ragged_dims, device)

"""Fuzzing the public constructors and main functions with valid and invalid arguments.

A hypothesis strategy draws a ground truth (a list of samples), the arguments of one
constructor that describe it, and then either keeps them or breaks one argument in one of the
ways a user gets it wrong (fractional, bool, string, None, negative or inconsistent sizes,
offsets that do not start at 0 or decrease, a ``max_len`` below the longest sample, a
non-prefix mask, unsorted row ids, ...). Every outcome is classified:

* ``ok``: a valid input gave the reference result, or an invalid one raised ``TypeError`` /
  ``ValueError`` / ``IndexError`` naming the broken argument;
* ``silent wrong result``: a valid input gave another result, or an invalid one was accepted;
* ``valid input rejected``;
* ``undocumented exception type``: anything but those three;
* ``unhelpful message``: the error does not name the argument.

Valid batches then go through the main functions (``padded``, ``max_shape``, slicing, a sum
over the ragged dim, indexing, ``.to``, ``+``) against a per-sample loop. The default run draws
a few hundred cases; ``pytest -m slow`` draws 10,000 and prints the counts.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nestbatch as nb
from nestbatch import NestedBatch

DOCUMENTED = (TypeError, ValueError, IndexError)
OUTCOMES: collections.Counter = collections.Counter()


@dataclass
class Case:
    """One call: the constructor, its arguments, the ground truth, and what was broken."""

    constructor: str
    args: tuple
    kwargs: dict
    samples: list[torch.Tensor]
    broken: str | None = None  # the argument name a valid call must not accept
    notes: list[str] = field(default_factory=list)

    def build(self) -> Any:
        if self.constructor == "nested":
            return nb.nested(*self.args, **self.kwargs)
        return getattr(NestedBatch, self.constructor)(*self.args, **self.kwargs)


# ------------------------------------------------------------------------------ ground truth
@st.composite
def ground_truth(draw) -> list[torch.Tensor]:
    lengths = draw(st.lists(st.integers(0, 5), min_size=0, max_size=5))
    feature = draw(st.sampled_from([(), (2,)]))
    dtype = draw(st.sampled_from([torch.float32, torch.int64]))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, *feature, generator=gen) * 10).to(dtype) for n in lengths]


def _packed(samples: list[torch.Tensor]) -> torch.Tensor:
    if samples:
        return torch.cat(samples)
    return torch.zeros(0)


def _padded(samples: list[torch.Tensor]) -> torch.Tensor:
    width = max((len(s) for s in samples), default=0)
    feature = samples[0].shape[1:] if samples else ()
    dtype = samples[0].dtype if samples else torch.float32
    out = torch.zeros(len(samples), width, *feature, dtype=dtype)
    for b, s in enumerate(samples):
        out[b, : len(s)] = s
    return out


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


# ------------------------------------------------------------------------------ breaking sizes
_SIZE_BREAKS = ("fraction", "bool", "string", "none", "negative", "float_tensor", "matrix")


def _break_sizes(sizes: list[int], how: str, draw) -> Any:
    if how == "fraction":
        at = draw(st.integers(0, max(len(sizes) - 1, 0)))
        out: list[Any] = list(sizes) or [0]
        out[min(at, len(out) - 1)] = out[min(at, len(out) - 1)] + 0.5
        return out
    if how == "bool":
        return [True] + list(sizes)
    if how == "string":
        return "".join(str(n % 10) for n in sizes) or "0"
    if how == "none":
        return None
    if how == "negative":
        return [-1] + list(sizes)
    if how == "float_tensor":
        return torch.tensor(sizes or [0], dtype=torch.float32)
    return torch.tensor([sizes or [0]])


@st.composite
def cases(draw) -> Case:
    samples = draw(ground_truth())
    lengths = [len(s) for s in samples]
    values = _packed(samples)
    constructor = draw(st.sampled_from(
        ["from_lengths", "from_offsets", "from_row_ids", "from_padded", "from_padded_mask",
         "from_row_starts", "from_row_limits", "nested"]
    ))
    tensor_sizes = draw(st.booleans())
    size = (lambda s: torch.tensor(s, dtype=torch.int64)) if tensor_sizes else list
    break_it = draw(st.booleans())
    longest = max(lengths, default=0)

    if constructor == "from_lengths":
        kwargs = {}
        if draw(st.booleans()):
            kwargs["max_len"] = longest + draw(st.integers(0, 2))
        case = Case("from_lengths", (values, size(lengths)), kwargs, samples)
        if break_it:
            how = draw(st.sampled_from(_SIZE_BREAKS + ("sum", "max_len", "max_len_type")))
            if how == "sum":
                case.args = (values, size([*lengths, 1]))
                case.broken = "lengths"
            elif how in ("max_len", "max_len_type"):
                if how == "max_len" and longest == 0:
                    return case
                case.kwargs["max_len"] = longest - 1 if how == "max_len" else 1.5
                case.broken = "max_len"
            else:
                case.args = (values, _break_sizes(lengths, how, draw))
                case.broken = "lengths"
        return case

    if constructor == "from_offsets":
        offsets = _offsets(lengths)
        case = Case("from_offsets", (values, size(offsets)), {}, samples)
        if break_it:
            how = draw(st.sampled_from(["start", "end", "decrease", "fraction", "matrix",
                                        "float_tensor", "max_len"]))
            if how == "start":
                case.args = (values, size([1, *offsets[1:]]))
            elif how == "end":
                case.args = (values, size([*offsets[:-1], offsets[-1] + 1]))
            elif how == "decrease":
                if len(offsets) < 3 or lengths[0] == 0:
                    return case
                case.args = (values, size([0, offsets[1], offsets[1] - 1, *offsets[3:]]))
            elif how == "max_len":
                if longest == 0:
                    return case
                case.kwargs["max_len"] = longest - 1
                case.broken = "max_len"
                return case
            else:
                case.args = (values, _break_sizes(offsets, how, draw))
            case.broken = "offsets"
        return case

    if constructor == "from_row_ids":
        row_ids = [b for b, n in enumerate(lengths) for _ in range(n)]
        kwargs = {"num_rows": len(lengths)}
        case = Case("from_row_ids", (values, torch.tensor(row_ids, dtype=torch.int64)), kwargs,
                    samples)
        if break_it:
            how = draw(st.sampled_from(["num_rows_type", "num_rows_negative", "num_rows_huge",
                                        "unsorted", "out_of_range", "float"]))
            if how.startswith("num_rows"):
                case.kwargs["num_rows"] = {"num_rows_type": "3", "num_rows_negative": -1,
                                           "num_rows_huge": 2**40}[how]
                case.broken = "num_rows"
            elif how == "float":
                case.args = (values, torch.tensor(row_ids, dtype=torch.float32))
                case.broken = "row_ids"
            else:
                if len(set(row_ids)) < 2:
                    return case
                broken = list(row_ids)
                if how == "unsorted":
                    broken = broken[::-1]
                else:
                    broken[-1] = len(lengths)
                case.args = (values, torch.tensor(broken))
                case.broken = "row_ids"
        return case

    if constructor in ("from_padded", "from_padded_mask"):
        data = _padded(samples)
        if constructor == "from_padded_mask":
            mask = torch.arange(data.shape[1] if data.dim() > 1 else 0) < torch.tensor(
                lengths, dtype=torch.int64).reshape(-1, 1)
            case = Case("from_padded", (data,), {"mask": mask}, samples)
            if break_it and data.dim() > 1 and data.shape[1] > 1 and lengths:
                broken = mask.clone()
                broken[0, 0], broken[0, 1] = False, True  # a gap before an element
                case.kwargs["mask"] = broken
                case.broken = "mask"
            return case
        case = Case("from_padded", (data, size(lengths)), {}, samples)
        if break_it:
            how = draw(st.sampled_from(_SIZE_BREAKS + ("too_long",)))
            if how == "too_long":
                if not lengths:
                    return case
                case.args = (data, size([lengths[0] + data.shape[1] + 1, *lengths[1:]]))
            else:
                case.args = (data, _break_sizes(lengths, how, draw))
            case.broken = "lengths"
        return case

    if constructor in ("from_row_starts", "from_row_limits"):
        offsets = _offsets(lengths)
        bounds = offsets[:-1] if constructor == "from_row_starts" else offsets[1:]
        name = "row_starts" if constructor == "from_row_starts" else "row_limits"
        case = Case(constructor, (values, size(bounds)), {}, samples)
        if break_it:
            how = draw(st.sampled_from(["fraction", "string", "none", "scalar_values"]))
            if how == "scalar_values":
                case.args = (torch.tensor(3.0), size(bounds))
                case.broken = "values"
            else:
                case.args = (values, _break_sizes(bounds, how, draw))
                case.broken = name
        return case

    # nested(list of samples)
    kwargs = {}
    case = Case("nested", (list(samples),), kwargs, samples)
    if break_it and samples:
        how = draw(st.sampled_from(["num_ragged_dims_none", "num_ragged_dims_float",
                                    "num_ragged_dims_zero", "not_a_list", "mixed_feature"]))
        if how.startswith("num_ragged_dims"):
            case.kwargs["num_ragged_dims"] = {"num_ragged_dims_none": None,
                                              "num_ragged_dims_float": 1.5,
                                              "num_ragged_dims_zero": 0}[how]
            case.broken = "num_ragged_dims"
        elif how == "not_a_list":
            case.args = ("samples",)
            case.broken = "tensors"
        else:
            odd = torch.zeros(1, 3, dtype=samples[0].dtype)
            # A sample with no element fits any shape (the reference's rule): only a sample
            # with elements of another shape makes the list inconsistent.
            if not any(s.numel() and s.shape[1:] != odd.shape[1:] for s in samples):
                return case
            case.args = ([*samples, odd],)
            case.broken = "tensors"
    return case


# ------------------------------------------------------------------------------ checking
def _same_samples(batch: NestedBatch, samples: list[torch.Tensor]) -> bool:
    got = batch.unbind()
    return len(got) == len(samples) and all(
        g.shape == s.shape and g.dtype == s.dtype and torch.equal(g, s)
        for g, s in zip(got, samples)
    )


def _main_functions_agree(
    batch: NestedBatch, samples: list[torch.Tensor], max_len: int | None, draw
) -> str | None:
    """The first main function that disagrees with the per-sample reference, or None.

    A ``max_len`` given to the constructor is the padded length (at least the longest sample).
    """
    filler = draw(st.sampled_from([0, -1, 7]))
    padded = batch.padded(filler).data
    width = max((len(s) for s in samples), default=0) if max_len is None else max_len
    if tuple(batch.max_shape) != (width,) or padded.shape[:2] != (len(samples), width):
        return "padded / max_shape"
    for b, s in enumerate(samples):
        if not torch.equal(padded[b, : len(s)], s) or (padded[b, len(s):] != filler).any():
            return "padded"
    start = draw(st.one_of(st.none(), st.integers(-4, 4)))
    stop = draw(st.one_of(st.none(), st.integers(-4, 4)))
    sliced = batch[:, start:stop]
    if not _same_samples(sliced, [s[start:stop] for s in samples]):
        return "slicing"
    if samples and samples[0].is_floating_point():
        total = torch.sum(batch, dim=1)
        expected = torch.stack([s.sum(0) for s in samples])
        if not torch.allclose(total, expected, atol=1e-4):
            return "sum over the ragged dim"
    if samples:
        index = draw(st.lists(st.integers(-len(samples), len(samples) - 1), max_size=4))
        if not _same_samples(batch[index], [samples[i] for i in index]):
            return "indexing"
    if not _same_samples(batch.to(torch.float64), [s.to(torch.float64) for s in samples]):
        return ".to"
    if not _same_samples(batch + batch, [s + s for s in samples]):
        return "+"
    return None


def classify(case: Case, draw) -> str:
    try:
        result = case.build()
    except DOCUMENTED as error:
        if case.broken is None:
            return "valid input rejected"
        if case.broken not in str(error):
            return "unhelpful message"
        return "ok"
    except Exception:  # noqa: BLE001 (the point is to see every other type)
        return "undocumented exception type"
    if case.broken is not None:
        return "silent wrong result"
    if not _same_samples(result, case.samples):
        return "silent wrong result"
    try:
        disagreement = _main_functions_agree(
            result, case.samples, case.kwargs.get("max_len"), draw
        )
    except DOCUMENTED:
        return "valid input rejected"
    except Exception:  # noqa: BLE001
        return "undocumented exception type"
    return "ok" if disagreement is None else "silent wrong result"


def _check(data) -> None:
    case = data.draw(cases())
    outcome = classify(case, data.draw)
    OUTCOMES[outcome] += 1
    assert outcome == "ok", (outcome, case.constructor, case.broken, case.args, case.kwargs)


_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@settings(max_examples=300, **_SETTINGS)
@given(st.data())
def test_fuzz_constructors_and_main_functions(data):
    _check(data)


@pytest.mark.slow
@settings(max_examples=10_000, **_SETTINGS)
@given(st.data())
def test_fuzz_long_run(data):
    _check(data)


@pytest.mark.slow
def test_fuzz_long_run_report(capsys):
    """Prints the outcome counts of the long run (run it after ``test_fuzz_long_run``)."""
    with capsys.disabled():
        print(f"\nfuzz outcomes: {dict(OUTCOMES)}")


# ------------------------------------------------------------------------------ misuse
def _misuses(batch: NestedBatch) -> dict[str, tuple[Any, str]]:
    """Wrong calls on a valid batch: the call and a word its error must contain."""
    other = nb.nested([torch.zeros(n + 1, *batch.feature_shape, dtype=batch.dtype)
                       for n in batch.lengths.tolist()])
    return {
        "index None": (lambda: batch[None], "index"),
        "index str": (lambda: batch["a"], "index"),
        "index float": (lambda: batch[1.5], "index"),
        "index past the end": (lambda: batch[[0, batch.batch_size]], "out of range"),
        "integer on the ragged dim": (lambda: batch[:, 0], "ragged dim"),
        "sample past the end": (lambda: batch[batch.batch_size], "out of range"),
        "padding_value str": (lambda: batch.padded("x"), "padding_value"),
        # (torch.full refuses an int no 64-bit scalar holds, whatever the dtype)
        "padding_value out of range": (lambda: batch.padded(10**30), "padding_value"),
        "reduce dim out of range": (lambda: torch.sum(batch, dim=9), "dim"),
        "different structures": (lambda: batch + other, "structure"),
        "max_shape too small": (lambda: batch.padded(0, max_shape=[-2]), "max_shape"),
    }


@settings(max_examples=100, **_SETTINGS)
@given(samples=ground_truth(), which=st.sampled_from(sorted(_misuses(nb.nested([]))) ))
def test_fuzz_misuse_of_main_functions(samples, which):
    batch = nb.nested(samples) if samples else NestedBatch.from_lengths(torch.zeros(0), [])
    call, word = _misuses(batch)[which]
    if which == "max_shape too small" and max(batch.lengths.tolist(), default=0) == 0:
        word = "max_shape"
    try:
        call()
    except DOCUMENTED as error:
        outcome = "ok" if word in str(error) else "unhelpful message"
    except Exception:  # noqa: BLE001
        outcome = "undocumented exception type"
    else:
        outcome = "silent wrong result"
    if which == "different structures" and batch.batch_size == 0:
        outcome = "ok"  # two empty batches have the same structure
    OUTCOMES[outcome] += 1
    assert outcome == "ok", (which, outcome)

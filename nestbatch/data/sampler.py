"""`TokenBudgetBatchSampler`: batches of similar-length samples under a token budget, sharded.

A ``DataLoader(dataset, batch_sampler=TokenBudgetBatchSampler(lengths, max_tokens), collate_fn=
nestbatch.pack)`` gets batches whose cost (padded ``max_len * n`` or packed ``sum(len)``) fits
``max_tokens``: short samples come many to a batch, long ones few, and every batch holds samples
of similar length, so a padded batch wastes little and a packed one fills its budget.

Each epoch (seeded by ``seed + epoch``, like ``DistributedSampler``):

1. the samples are shuffled (``shuffle=True``) and cut into windows of ``window`` samples;
2. each window is sorted by length (ties keep the shuffled order) and cut greedily, in that order,
   into batches whose cost fits the budget and that hold at most ``max_samples`` samples;
3. the batches are shuffled (long and short ones interleave across the epoch);
4. the batch list is made a multiple of ``num_replicas`` long, by repeating batches from its start
   (or, with ``drop_last``, by dropping its tail), and rank ``r`` takes batches ``r::num_replicas``.

Every rank therefore yields the same number of batches (a DDP step never waits on a rank that ran
out), and every sample comes once per epoch, except the samples of the repeated batches (twice)
or of the dropped ones (not at all), which :meth:`TokenBudgetBatchSampler.stats` counts. Every rank
must be built with the same lengths, budget and seed: the plan is computed, identically, on each.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Sampler

from nestbatch.checks import check_count, host_ints, negative_error

__all__ = ["SamplerStats", "TokenBudgetBatchSampler"]

_COSTS = ("padded", "packed")


@dataclass(frozen=True)
class SamplerStats:
    """How one epoch of a :class:`TokenBudgetBatchSampler` uses its budget (all ranks together).

    Attributes
    ----------
    epoch : int
        The epoch these numbers describe.
    cost : str
        ``"padded"`` or ``"packed"``: what the budget counted.
    max_tokens : int
        The budget of one batch.
    num_batches : int
        Batches each rank yields.
    num_batches_total : int
        Batches of all ranks (``num_batches * num_replicas``), repeats included.
    samples : int
        Samples in those batches, repeats included.
    repeated_samples, dropped_samples : int
        Samples yielded twice (to even the ranks' batch counts) or not at all (``drop_last``).
    tokens : int
        Tokens of those samples (the packed cost).
    padded_tokens : int
        Their cost padded: ``max_len * n`` summed over the batches.
    oversized_batches, oversized_tokens : int
        Batches of one sample longer than the budget (such a sample goes alone), and their
        tokens; the fills leave them out.
    """

    epoch: int
    cost: str
    max_tokens: int
    num_batches: int
    num_batches_total: int
    samples: int
    repeated_samples: int
    dropped_samples: int
    tokens: int
    padded_tokens: int
    oversized_batches: int
    oversized_tokens: int

    def _fill(self, spent: int) -> float:
        batches = self.num_batches_total - self.oversized_batches
        return (spent - self.oversized_tokens) / (batches * self.max_tokens) if batches else 0.0

    @property
    def padding_waste(self) -> float:
        """The fraction of the padded batches that is padding (0 when padding costs nothing)."""
        return 1.0 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0

    @property
    def budget_fill(self) -> float:
        """The mean fraction of the budget a batch uses, its cost counted as the sampler counts
        it (oversized batches left out)."""
        return self._fill(self.padded_tokens if self.cost == "padded" else self.tokens)

    @property
    def packed_fill(self) -> float:
        """The mean fraction of the budget a batch's real tokens use (a packed batch's cost;
        oversized batches left out)."""
        return self._fill(self.tokens)

    def __str__(self) -> str:
        return (
            f"epoch {self.epoch}: {self.num_batches} batches per rank ({self.num_batches_total} "
            f"in all), {self.samples} samples ({self.repeated_samples} repeated, "
            f"{self.dropped_samples} dropped), {self.tokens} tokens, padding waste "
            f"{self.padding_waste:.1%}, budget fill {self.budget_fill:.1%} ({self.cost} cost), "
            f"{self.oversized_batches} oversized"
        )


@dataclass(frozen=True)
class _Plan:
    """One epoch's batches: slices ``[start, end)`` of ``order`` (samples sorted by length within
    their windows; ``lengths`` theirs, in that order), in yield order over all ranks."""

    order: list[int]
    lengths: list[int]
    slices: list[tuple[int, int]]
    repeated: int  # batches appended again at the end, from the start
    dropped: list[tuple[int, int]]


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of sample indices under a token budget, bucketed by length, shuffled, sharded.

    Parameters
    ----------
    lengths : sequence of int or Tensor
        The length (tokens) of every sample of the dataset, ``(N,)`` non-negative.
    max_tokens : int
        The budget of one batch: its cost (see ``cost``) is at most this. A sample longer than
        the budget is not refused: it forms a batch alone (counted in :meth:`stats`).
    max_samples : int, optional
        At most this many samples per batch (kernels and memory may want a cap on ``B``).
    cost : {"padded", "packed"}, default "padded"
        What a batch costs: ``max_len * n`` (it will be padded) or ``sum(len)`` (it will be
        packed; the batch fills its budget with real tokens).
    shuffle : bool, default True
        Shuffle the samples before bucketing and the batches after; with False, the samples are
        bucketed in dataset order and the batches come in that order.
    seed : int, default 0
        Seed of the shuffles (``seed + epoch``); every rank must use the same.
    window : int, optional
        Samples sorted together (a bucketing window). Smaller windows mix lengths more across
        epochs (batch contents change from epoch to epoch) at the price of more padding and
        emptier batches; the default sorts the whole dataset (the least waste; batches then
        differ between epochs only in which equal-length samples they pair).
    num_replicas, rank : int, optional
        The data-parallel world size and this process's rank; by default those of the
        initialized default process group, else 1 and 0.
    drop_last : bool, default False
        Drop the last batches of the epoch to make their count a multiple of ``num_replicas``,
        rather than repeat batches from the start.

    Examples
    --------
    >>> sampler = TokenBudgetBatchSampler(lengths, max_tokens=4096, cost="packed", seed=0)
    >>> loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=nestbatch.pack)
    >>> for epoch in range(epochs):
    ...     sampler.set_epoch(epoch)
    ...     for batch in loader: ...
    """

    def __init__(
        self,
        lengths: Sequence[int] | Tensor,
        max_tokens: int,
        *,
        max_samples: int | None = None,
        cost: str = "padded",
        shuffle: bool = True,
        seed: int = 0,
        window: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self.lengths = _host_lengths(lengths)
        self._lengths = torch.tensor(self.lengths, dtype=torch.int64)
        self.max_tokens = _positive(max_tokens, "max_tokens")
        self.max_samples = None if max_samples is None else _positive(max_samples, "max_samples")
        if cost not in _COSTS:
            raise ValueError(f'cost must be "padded" or "packed", got {cost!r}')
        self.cost = cost
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.window = None if window is None else _positive(window, "window")
        self.num_replicas, self.rank = _replicas(num_replicas, rank)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._cached: tuple[int, _Plan] | None = None  # (epoch, its plan)

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffles of ``epoch`` from the next iteration on (call it on every rank)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (the same on every rank)."""
        return len(self._plan().slices) // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        plan = self._plan()
        for start, end in plan.slices[self.rank::self.num_replicas]:
            yield plan.order[start:end]

    def stats(self) -> SamplerStats:
        """Padding waste, budget fill, repeats and drops of the current epoch (all ranks)."""
        plan = self._plan()
        lengths = plan.lengths
        cum = [0, *itertools.accumulate(lengths)]

        def tokens(s: tuple[int, int]) -> int:
            return cum[s[1]] - cum[s[0]]

        def padded(s: tuple[int, int]) -> int:
            return lengths[s[1] - 1] * (s[1] - s[0])  # ascending within a batch: the last longest

        kept = plan.slices
        oversized = [(s, e) for s, e in kept if e - s == 1 and lengths[s] > self.max_tokens]
        repeated = kept[len(kept) - plan.repeated:] if plan.repeated else []
        return SamplerStats(
            epoch=self.epoch, cost=self.cost, max_tokens=self.max_tokens,
            num_batches=len(kept) // self.num_replicas, num_batches_total=len(kept),
            samples=sum(e - s for s, e in kept),
            repeated_samples=sum(e - s for s, e in repeated),
            dropped_samples=sum(e - s for s, e in plan.dropped),
            tokens=sum(map(tokens, kept)), padded_tokens=sum(map(padded, kept)),
            oversized_batches=len(oversized), oversized_tokens=sum(map(tokens, oversized)),
        )

    def __repr__(self) -> str:
        return (
            f"TokenBudgetBatchSampler(samples={len(self.lengths)}, max_tokens={self.max_tokens}, "
            f"max_samples={self.max_samples}, cost={self.cost!r}, rank={self.rank} of "
            f"{self.num_replicas}, seed={self.seed}; {self.stats()})"
        )

    # ------------------------------------------------------------------------------- the plan
    def _plan(self) -> _Plan:
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._make_plan())
        return self._cached[1]

    def _make_plan(self) -> _Plan:
        """This epoch's plan. Its ``tolist()`` reads are no syncs: the lengths are a host tensor
        and the generator a CPU one throughout (the plan is host data: sample indices)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = self._bucketed_order(generator)
        lengths = self._lengths[order].tolist()
        slices = self._cut(lengths)
        if self.shuffle and slices:
            slices = [slices[i] for i in torch.randperm(len(slices), generator=generator).tolist()]
        return self._even_out(_Plan(order.tolist(), lengths, slices, 0, []))

    def _bucketed_order(self, generator: torch.Generator) -> Tensor:
        """The samples shuffled, then sorted by length within each window (one stable sort of
        the key ``window * (longest + 1) + length``: ties keep the shuffled order)."""
        count, lengths = len(self.lengths), self._lengths
        order = torch.randperm(count, generator=generator) if self.shuffle else torch.arange(count)
        window = self.window or max(count, 1)
        longest = int(lengths.max()) + 1 if count else 1
        key = torch.arange(count) // window * longest + lengths[order]
        return order[torch.sort(key, stable=True).indices]

    def _cut(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Greedy batches along the sorted ``lengths``, never across a window: each as long as
        its cost fits the budget (found by bisection, the cost being monotone in its end): a
        Python step per batch, not per sample."""
        count = len(lengths)
        cum = [0, *itertools.accumulate(lengths)]
        budget, cap = self.max_tokens, self.max_samples or count
        window = self.window or max(count, 1)
        packed = self.cost == "packed"
        slices, start = [], 0
        while start < count:
            limit = min(start + cap, (start // window + 1) * window, count)

            def cost(end: int, start: int = start) -> int:
                if packed:
                    return cum[end] - cum[start]
                return lengths[end - 1] * (end - start)  # sorted: the last is the longest

            fits = bisect.bisect_right(range(start + 1, limit + 1), budget, key=cost)
            end = start + max(fits, 1)  # a sample over the budget goes alone
            slices.append((start, end))
            start = end
        return slices

    def _even_out(self, plan: _Plan) -> _Plan:
        """The plan with its batch list made a multiple of ``num_replicas`` long: its tail
        dropped, or batches from its start repeated (cycling, for fewer batches than ranks)."""
        slices, replicas = plan.slices, self.num_replicas
        extra = len(slices) % replicas
        if self.drop_last or not slices:
            kept = len(slices) - extra
            return _Plan(plan.order, plan.lengths, slices[:kept], 0, slices[kept:])
        missing = (replicas - extra) % replicas
        repeats = [slices[i % len(slices)] for i in range(missing)]
        return _Plan(plan.order, plan.lengths, slices + repeats, missing, [])


def _host_lengths(lengths: object) -> list[int]:
    """The lengths as a list of non-negative Python ints. A tensor is read once, when the
    sampler is built (a sync if it lives on a GPU): the plan is made on the host."""
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
            raise TypeError(
                "lengths must be a 1-d integer tensor or a sequence of ints, got a tensor of "
                f"dtype {lengths.dtype} and shape {tuple(lengths.shape)}"
            )
        values = lengths.tolist()
    else:
        values = list(host_ints(lengths, "lengths"))
    if values and min(values) < 0:
        raise negative_error("lengths", min(values))
    return values


def _positive(value: object, name: str) -> int:
    if check_count(value, name) < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def _replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, the default process group's when not given."""
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = torch.distributed.get_world_size() if initialized else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialized else 0
    num_replicas = _positive(num_replicas, "num_replicas")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas - 1}], got {rank!r}")
    return num_replicas, rank

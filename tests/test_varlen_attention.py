"""Attention on the packed layout: the dispatch table, the varlen kernels on fake CUDA (which
kernel, how many launches, no sync, shapes) for torch.nested's ``(B, H, j, E)`` form and
:func:`nestbatch.sequence_attention`, a ``(B, j, H, E)`` batch (attention over ``H``) as plain
attention on the packed values, the varlen backward called directly, and every option against
a per-sample ``F.scaled_dot_product_attention`` loop on the CPU path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from gpu_path import count, fake_cuda, trace

import nestbatch
from nestbatch import NestedBatch
from nestbatch.ops import varlen_attention as va

LENGTHS = [3, 5, 2, 7]


# ------------------------------------------------------------------------------ dispatch table
_BASE = va.Request(
    device_type="cuda", dtype=torch.bfloat16, head_dim=64, value_head_dim=64, query_heads=8,
    key_heads=8, has_mask=False, is_causal=False, same_structure=True,
    keys_known_nonempty=True, sizes_on_host=True, enable_gqa=False,
)
_TABLE = [
    ({}, "flash"),
    ({"dtype": torch.float16}, "flash"),
    ({"dtype": torch.float32}, "efficient"),
    ({"dtype": torch.float64}, "padded"),
    ({"device_type": "cpu"}, "padded"),
    ({"has_mask": True}, "padded"),
    ({"keys_known_nonempty": False}, "padded"),
    ({"sizes_on_host": False}, "padded"),
    ({"head_dim": 36, "value_head_dim": 36}, "padded"),
    ({"head_dim": 512, "value_head_dim": 512}, "padded"),
    ({"value_head_dim": 32}, "efficient"),
    ({"is_causal": True}, "flash"),
    ({"is_causal": True, "same_structure": False}, "efficient"),
    ({"key_heads": 2}, "padded"),  # no enable_gqa: torch's own error on the padded path
    ({"key_heads": 2, "enable_gqa": True}, "flash"),
    ({"key_heads": 3, "enable_gqa": True}, "padded"),
    ({"key_heads": 2, "enable_gqa": True, "dtype": torch.float32}, "efficient"),
    ({"heads_flatten": False}, "padded"),  # heads that do not flatten into one dim
]


@pytest.mark.parametrize("change, backend", _TABLE)
def test_dispatch_table(change, backend):
    assert va.choose_backend(dataclasses.replace(_BASE, **change)) == backend


def test_dispatch_rows_are_in_order():
    assert [name for name, _ in va.DISPATCH] == ["padded", "flash", "efficient", "padded"]


# ------------------------------------------------------------------------------ fake CUDA
def _batches(dtype, heads=8, key_heads=8, head_dim=64, key_lengths=None, device="cuda"):
    """Sequences-first ``(B, j, H, E)`` batches (samples ``(L_i, H, E)``, ``ragged_dim`` 1)."""
    total = sum(LENGTHS)
    q = NestedBatch.from_lengths(torch.randn(total, heads, head_dim, device=device, dtype=dtype),
                                 LENGTHS)
    lengths = LENGTHS if key_lengths is None else key_lengths
    k = NestedBatch.from_lengths(
        torch.randn(sum(lengths), key_heads, head_dim, device=device, dtype=dtype), lengths
    )
    v = k.with_values(torch.randn_like(k.values))
    return q, k, v


def _heads_first(dtype, **options):
    """torch.nested's ``(B, H, j, E)`` form (``ragged_dim`` 2): what attends over ``j``."""
    return tuple(x.transpose(1, 2) for x in _batches(dtype, **options))


@pytest.mark.parametrize(
    "dtype, options, kernel",
    [
        (torch.bfloat16, {}, "aten._flash_attention_forward.default"),
        (torch.float16, {"is_causal": True}, "aten._flash_attention_forward.default"),
        (torch.float16, {"dropout_p": 0.1, "scale": 0.3}, "aten._flash_attention_forward.default"),
        (torch.float32, {}, "aten._efficient_attention_forward.default"),
        (torch.float32, {"is_causal": True, "dropout_p": 0.2},
         "aten._efficient_attention_forward.default"),
    ],
)
@pytest.mark.parametrize("call", ["F.scaled_dot_product_attention (B, H, j, E)",
                                  "nestbatch.sequence_attention (B, j, H, E)"])
def test_varlen_kernel_on_fake_cuda(dtype, options, kernel, call):
    # First call: the offsets' copy to the device and their int32 cast (cached on the
    # partition); later calls: the kernel alone. No sync, no host-to-device copy.
    fn, ragged_dim = F.scaled_dot_product_attention, 2
    if call.startswith("nestbatch"):
        fn, ragged_dim = nestbatch.sequence_attention, 1
    with fake_cuda():
        q, k, v = _heads_first(dtype) if ragged_dim == 2 else _batches(dtype)
        out, first = trace(fn, q, k, v, **options)
        second = count(fn, q, k, v, **options)
    assert first.ops == ["aten._to_copy.default", "aten._to_copy.default", kernel]
    assert first.syncs == []
    assert second.ops == [kernel] and second.syncs == [] and second.host_to_device == []
    assert out.values.shape == (sum(LENGTHS), 8, 64) and out.values.dtype == dtype
    assert out.values.device.type == "cuda" and out.partition is q.partition
    assert out.ragged_dim == ragged_dim


def test_cross_attention_and_grouped_heads_on_fake_cuda():
    with fake_cuda():
        q, k, v = _heads_first(torch.bfloat16, key_heads=2, key_lengths=[4, 1, 6, 2])
        out, t = trace(F.scaled_dot_product_attention, q, k, v, enable_gqa=True)
        assert t.ops[-1] == "aten._flash_attention_forward.default" and t.syncs == []
        assert out.values.shape == (sum(LENGTHS), 8, 64)
        # fp32 grouped heads: the efficient kernel, key heads repeated for it.
        q, k, v = _heads_first(torch.float32, key_heads=2, key_lengths=[4, 1, 6, 2])
        t = count(F.scaled_dot_product_attention, q, k, v, enable_gqa=True)
        assert t.ops.count("aten.clone.default") == 2  # repeat_interleave of k and v heads
        assert t.ops[-1] == "aten._efficient_attention_forward.default"


def test_single_head_and_several_heads_dims_on_fake_cuda():
    with fake_cuda():
        # (B, j, E): one head, a view (total, 1, E).
        single = NestedBatch.from_lengths(
            torch.randn(sum(LENGTHS), 64, device="cuda", dtype=torch.float16), LENGTHS
        )
        F.scaled_dot_product_attention(single, single, single)
        out, t = trace(F.scaled_dot_product_attention, single, single, single)
        assert t.ops == ["aten._flash_attention_forward.default"] and t.syncs == []
        assert out.values.shape == (sum(LENGTHS), 64) and out.ragged_dim == 1
        # (B, X, H, j, E): the heads flattened into one dim (a view), no copy.
        values = torch.randn(sum(LENGTHS), 2, 4, 64, device="cuda", dtype=torch.bfloat16)
        x = NestedBatch.from_lengths(values, LENGTHS).permute(0, 2, 3, 1, 4)
        F.scaled_dot_product_attention(x, x, x)
        out, t = trace(F.scaled_dot_product_attention, x, x, x)
        assert t.ops == ["aten._flash_attention_forward.default"] and t.syncs == []
        assert out.values.shape == (sum(LENGTHS), 2, 4, 64) and out.ragged_dim == 3


def test_sequences_first_batch_attends_over_heads_on_fake_cuda():
    # (B, j, H, E) given to F.scaled_dot_product_attention: H is at dim -2, the ragged dim is a
    # batch dim. torch's attention on the packed values (total, H, E); no varlen kernel, no
    # padding, no sync, and the same partition out.
    with fake_cuda():
        q, k, v = _batches(torch.float32)
        k, v = q.with_values(k.values), q.with_values(v.values)
        out, t = trace(F.scaled_dot_product_attention, q, k, v)
        expected = count(F.scaled_dot_product_attention, q.values, k.values, v.values)
    assert t.ops == expected.ops and t.syncs == [] and t.host_to_device == []
    assert not any("flash" in op or "efficient" in op or "nestbatch" in op for op in t.ops)
    assert out.partition is q.partition and out.ragged_dim == 1


def test_padded_fallback_on_fake_cuda_has_no_sync():
    with fake_cuda():
        q, k, v = _heads_first(torch.float64)
        t = count(F.scaled_dot_product_attention, q, k, v)
        second = count(F.scaled_dot_product_attention, q, k, v)
        plain = [x.padded().data.movedim(1, -2) for x in (q, k, v)]
        torch_alone = count(F.scaled_dot_product_attention, *plain,
                            attn_mask=k.partition.mask()[:, None, None, :])
    assert "nestbatch.packed_to_padded.default" in t.ops and t.syncs == []
    assert not any("flash" in op or "efficient" in op for op in t.ops)
    # Every key sample non-empty (known on the host): beyond torch's own masked attention,
    # one negation of the query mask and one masked_fill of the padded queries' rows.
    assert second.syncs == [] and len(second.ops) == len(torch_alone.ops) + 2


@pytest.mark.parametrize("backend, dtype", [("flash", torch.bfloat16),
                                            ("efficient", torch.float32)])
def test_varlen_backward_called_directly(backend, dtype):
    # Autograd cannot run on fake CUDA tensors, so the backward function is called as
    # VarlenAttention.backward calls it.
    with fake_cuda():
        q, k, v = _batches(dtype)
        plan = va.Plan(backend, 7, 7, 0.1, True, None)
        qv, kv, vv = q.values, k.values, v.values
        cu = q.partition.offsets32
        out, saved = va.varlen_forward(plan, qv, kv, vv, cu, cu)
        grad = torch.randn_like(out)
        (dq, dk, dv), t = trace(va.varlen_backward, plan, grad, qv, kv, vv, out, cu, cu, saved)
    kernel = {"flash": "aten._flash_attention_backward.default",
              "efficient": "aten._efficient_attention_backward.default"}[backend]
    assert t.ops == [kernel] and t.syncs == []
    assert dq.shape == qv.shape and dk.shape == kv.shape and dv.shape == vv.shape


# ------------------------------------------------------------------------------ CPU numerics
def _per_sample(q, k, v, **options):
    # Torch on each logical sample (H, L_i, E) alone.
    return [F.scaled_dot_product_attention(a, b, c, **options)
            for a, b, c in zip(q.unbind(), k.unbind(), v.unbind())]


@pytest.mark.parametrize(
    "options, key_lengths, key_heads",
    [
        ({}, None, 4),
        ({"is_causal": True}, None, 4),
        ({"scale": 0.25}, None, 4),
        ({}, [4, 1, 6, 2], 4),  # cross-attention: other key lengths
        ({"is_causal": True}, [4, 1, 6, 2], 4),
        ({"enable_gqa": True}, None, 2),  # grouped-query attention
        ({"dropout_p": 1.0}, None, 4),  # everything dropped: zeros, as torch
    ],
)
def test_every_option_matches_per_sample_attention(options, key_lengths, key_heads):
    torch.manual_seed(0)
    q, k, v = _heads_first(torch.float64, heads=4, key_heads=key_heads, head_dim=8,
                           key_lengths=key_lengths, device="cpu")
    out = F.scaled_dot_product_attention(q, k, v, **options)
    assert out.ragged_dim == 2
    for got, expected in zip(out.unbind(), _per_sample(q, k, v, **options)):
        torch.testing.assert_close(got, expected)


def test_gradcheck_on_the_cpu_path():
    torch.manual_seed(1)
    q, k, v = _heads_first(torch.float64, heads=2, key_heads=1, head_dim=4,
                           key_lengths=[2, 3, 1, 2], device="cpu")
    tensors = [x.values.detach().requires_grad_() for x in (q, k, v)]

    def attend(qv, kv, vv):
        batches = (q.with_values(qv), k.with_values(kv), v.with_values(vv))
        return F.scaled_dot_product_attention(*batches, is_causal=True, enable_gqa=True).values

    assert torch.autograd.gradcheck(attend, tensors)

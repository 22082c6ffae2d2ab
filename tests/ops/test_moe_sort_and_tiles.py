"""The MoE kernels' bookkeeping: the sort of (token, choice) pairs by expert (`experts_sorted_triton.sort_pairs_triton`)
against torch's stable sort, with a shared expert's pairs last; the sorted kernels at the CUDA tiling; and the tile
choices both paths make for the H200 (`_tiles`, `block_m`). The kernels' values are in test_moe_triton.py. Runs on
CUDA, or on CPU tensors in Triton's interpreter."""
import pytest
import torch

from hybridcache.ops.triton_support import triton_testable

if not triton_testable(torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu")):
    pytest.skip("needs triton with CUDA, or TRITON_INTERPRET=1 (Triton's CPU interpreter)", allow_module_level=True)

from hybridcache.ops.moe import experts_sorted_triton, experts_triton, naive  # noqa: E402
from hybridcache.ops.moe.sort import sort_by_expert  # noqa: E402
from tests.ops.moe_testing import DEVICE, F32, D, I, gen, randn, routing  # noqa: E402


def test_sort_kernel_with_a_shared_expert_puts_every_token_last():
    """shared=M: each token's pairs k .. k+M-1 are experts E .. E+M-1's, sorted after the routed ones."""
    index = torch.tensor([[1, 0], [2, 1], [1, 2]], device=DEVICE)
    order, ends = experts_sorted_triton.sort_pairs_triton(index, 3, shared=1)
    # pairs p = n*3 + j: experts 1 0 E | 2 1 E | 1 2 E with E = 3
    assert order.tolist() == [1, 0, 4, 6, 3, 7, 2, 5, 8]
    assert ends.tolist() == [1, 4, 6, 9]
    order, ends = experts_sorted_triton.sort_pairs_triton(index, 3, shared=2)
    # pairs p = n*4 + j: experts 1 0 E E+1 | 2 1 E E+1 | 1 2 E E+1
    assert order.tolist() == [1, 0, 5, 8, 4, 9, 2, 6, 10, 3, 7, 11]
    assert ends.tolist() == [1, 4, 6, 9, 12]


@pytest.mark.parametrize("gated, act", [(True, "silu"), (True, "gelu"), (False, "relu2"), (False, "relu")])
def test_sorted_kernels_in_the_gpu_tiling(gated, act):
    """Tiles of (BLOCK_M, BLOCK_N, BLOCK_K) = (16, 32, 32) as on CUDA: 3 column tiles and 3 inner steps, the
    last of each masked; a token routed to one expert twice; x a column slice of a wider tensor."""
    e, k, n = 5, 2, 37
    up, down = randn(e, I, D, seed=1, scale=D ** -0.5), randn(e, D, I, seed=2, scale=I ** -0.5)
    gate = randn(e, I, D, seed=3, scale=D ** -0.5) if gated else None
    x = randn(n, D + 8, seed=4)[:, 8:]
    index, weight = routing(n, e, k, seed=5, dtype=F32)
    index[0] = 2
    order, _, ends = sort_by_expert(index, e)
    out = experts_sorted_triton.sorted_experts_triton(x, index, weight, order, ends, up, down, gate, act, F32,
                                                      tiles=(16, 32, 32), num_warps=8 if gated else 4)
    ref = naive.fused_experts_naive(x, index, weight, up, down, gate, act, F32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_sorted_tile_choice_for_the_h200(monkeypatch):
    """64 columns a program where that gives about 2 programs an SM over the blocks, else 32; 128 inner."""
    monkeypatch.setattr(experts_sorted_triton, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    for rows, inner in ((512, 2048), (2048, 512)):
        for pairs in (2, 65, 128, 512, 1024):
            block_m, block_n, block_k = experts_sorted_triton._tiles(pairs, 8, rows, inner, cuda)
            blocks = min(8, pairs) + pairs // block_m
            assert block_m == experts_sorted_triton.block_m(pairs, 8)
            assert block_k == 128 and block_n == (64 if blocks * -(-rows // 64) >= 2 * 132 else 32)


def test_block_m_leaves_headroom_over_the_mean_pairs_an_expert():
    """A power of two >= 1.5x the mean pairs an expert, within 16..64: the decode batches of the 1B
    checkpoints (8 experts, top 2) at N 16 / 64 / 256 take 16 / 32 / 64."""
    block_m = experts_sorted_triton.block_m
    assert [block_m(2 * n, 8) for n in (1, 16, 64, 128, 256, 4096)] == [16, 16, 32, 64, 64, 64]
    for pairs in range(1, 600, 7):
        for e in (1, 3, 8, 64):
            m = block_m(pairs, e)
            assert m & (m - 1) == 0 and 16 <= m <= 64
            assert m == 64 or m >= 1.5 * pairs / e, (pairs, e, m)


@pytest.mark.parametrize("n, k, e", [(1, 1, 1), (3, 2, 8), (40, 2, 8), (33, 1, 5), (300, 2, 7), (7, 3, 300)])
def test_sort_kernel_matches_the_torch_sort(n, k, e):
    """One launch, the order and run ends of torch's stable sort (`sort.sort_by_expert`)."""
    index = torch.randint(0, e, (n, k), generator=gen(n)).to(DEVICE)
    order, ends = experts_sorted_triton.sort_pairs_triton(index, e)
    ref_order, _, ref_ends = sort_by_expert(index, e)
    assert order.dtype == ends.dtype == torch.int32
    assert torch.equal(order.long(), ref_order) and torch.equal(ends, ref_ends)


def test_tile_choice_for_the_h200(monkeypatch):
    """qwen3_next / kimi_linear 1B expert shapes on 132 SMs: one pair (token) a program, a power of two of rows
    between 4 and 64, enough programs for about 4 an SM where the rows allow, a tile of at most TILE weights."""
    monkeypatch.setattr(experts_triton, "num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    for rows, inner in ((512, 2048), (2048, 512)):
        for count in (1, 2, 8, 32, 64):
            block, block_rows, block_in = experts_triton._tiles(count, rows, inner, cuda)
            assert block == 1 and 4 <= block_rows <= 64 and block_rows & (block_rows - 1) == 0
            assert block_rows * block_in <= experts_triton.TILE and block_in >= 16
            assert count * -(-rows // block_rows) >= min(4 * 132, count * rows // 4)

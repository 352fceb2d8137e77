import pytest

from pagedkv.gpu_budget import GIB, BudgetExceeded, GpuLedger, kv_blocks_that_fit


def test_reserve_release_and_breakdown():
    ledger = GpuLedger(1000)
    ledger.reserve("w0", 500, "weights")
    ledger.reserve("act", 17, "scratch")  # rounded up to 32
    assert ledger.by_kind() == {"weights": 512, "kv": 0, "scratch": 32, "staging": 0}  # 16-byte granules
    assert ledger.used_bytes == 544 and ledger.free_bytes == 456
    ledger.release("act")
    assert ledger.used_bytes == 512 and ledger.peak_bytes == 544


def test_over_budget_raises_and_changes_nothing():
    ledger = GpuLedger(1024)
    ledger.reserve("kv", 1000, "kv")
    before = ledger.snapshot()
    with pytest.raises(BudgetExceeded) as err:
        ledger.reserve("more", 64, "scratch")
    assert "'more'" in str(err.value) and "1,024-byte budget" in str(err.value)
    assert ledger.snapshot() == before


@pytest.mark.parametrize("bad", [0, -5, 1.5, None])
def test_bad_budget(bad):
    with pytest.raises(ValueError):
        GpuLedger(bad)


def test_bad_reservations():
    ledger = GpuLedger(GIB)
    ledger.reserve("a", 16, "kv")
    with pytest.raises(ValueError, match="already reserved"):
        ledger.reserve("a", 16, "kv")
    with pytest.raises(ValueError, match="unknown buffer kind"):
        ledger.reserve("b", 16, "textures")
    with pytest.raises(ValueError, match="positive byte size"):
        ledger.reserve("c", 0, "kv")
    with pytest.raises(KeyError):
        ledger.release("zzz")


def test_kv_blocks_that_fit_smollm2():
    # SmolLM2-135M, f16 KV, block 16: 23,040 B/token -> 368,640 B/block; 30 layers x (K, V).
    per_block = 23_040 * 16
    assert kv_blocks_that_fit(600 * 2**20, per_block, GIB, 30) == 600 * 2**20 // per_block == 1706
    # A small binding limit caps the blocks: each K or V buffer holds 6,144 B per block.
    assert kv_blocks_that_fit(600 * 2**20, per_block, 6_144 * 100, 30) == 100
    assert kv_blocks_that_fit(100, per_block, GIB, 30) == 0
    with pytest.raises(ValueError):
        kv_blocks_that_fit(GIB, 1001, GIB, 30)

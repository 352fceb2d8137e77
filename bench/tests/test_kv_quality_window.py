"""bench/kv_quality_window.py: the policies it compares fit the quick and the full segments."""
import pytest

from bench.kv_quality_window import policies

BS = 16


def test_window_benchmark_policies_fit_the_quick_and_full_segments():
    for seg_len, windows, h2o in ((256, [64], [25, 50]), (2048, [256, 512, 1024], [10, 20, 50])):
        groups = policies(seg_len, windows, h2o)
        names = [name for g in groups for name in g]
        assert [n for n in names if n.startswith("h2o")] == [f"h2o_{p}pct" for p in h2o]
        for name, (retention, pool, chunk) in ((n, s) for g in groups for n, s in g.items()):
            assert 2 <= pool <= seg_len // BS + 2, name
            if name.startswith("h2o"):  # budget blocks + one for the step; half the budget most recent
                assert retention.recent_tokens == (pool - 1) // 2 * BS and chunk == BS, name
    with pytest.raises(ValueError, match="at least 2"):
        policies(256, [64], [10])  # 10 % of 16 blocks is one block

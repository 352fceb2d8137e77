"""bench/__main__.py: how `python3 -m bench` marks and files each benchmark's result."""
from pathlib import Path

import bench.__main__ as runner


def test_a_result_says_which_form_ran_and_a_quick_form_in_a_full_run_does_not_replace_published_figures():
    out = Path("results")
    full_form = runner.finish("roofline", {"benchmark": "roofline"}, False, 12.345)
    assert (full_form["quick"], full_form["wall_s"]) == (False, 12.35)
    always_quick = runner.finish("kv_quality_window", {}, False, 1.0)  # its full form runs alone
    assert always_quick["quick"] is True and always_quick["benchmark"] == "kv_quality_window"
    assert runner.finish("roofline", {}, True, 1.0)["quick"] is True
    assert runner.destination(out, full_form, False) == out
    assert runner.destination(out, always_quick, False) == out / "quick"
    assert runner.destination(out / "quick", runner.finish("roofline", {}, True, 1.0), True) == out / "quick"


def test_the_browser_benchmarks_of_one_page_are_benchmarks_the_runner_knows():
    assert set(runner.ONE_PAGE) <= set(runner.BENCHMARKS)
    assert runner.argv_of("concurrency", True) == ["bench.concurrency", "--quick"]

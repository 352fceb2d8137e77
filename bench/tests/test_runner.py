"""bench/__main__.py: how `python3 -m bench` marks and files each benchmark's result, and writes the files a
result carries."""
import base64
import json
from pathlib import Path

import bench.__main__ as runner


def test_a_result_says_which_form_ran_and_a_quick_form_in_a_full_run_does_not_replace_published_figures():
    out = Path("results")
    full_form = runner.finish("roofline", {"benchmark": "roofline"}, runner.argv_of("roofline", False), 12.345)
    assert (full_form["quick"], full_form["wall_s"]) == (False, 12.35)
    # A LONG benchmark runs its quick form in a full run, its full form when --only names it.
    assert runner.argv_of("kv_quality_window", False) == ["bench.kv_quality_window", "--quick"]
    assert runner.argv_of("kv_quality_window", False, named=True) == ["bench.kv_quality_window"]
    always_quick = runner.finish("kv_quality_window", {}, runner.argv_of("kv_quality_window", False), 1.0)
    assert always_quick["quick"] is True and always_quick["benchmark"] == "kv_quality_window"
    assert runner.finish("roofline", {}, runner.argv_of("roofline", True), 1.0)["quick"] is True
    assert runner.destination(out, False, False) == out
    assert runner.destination(out, True, False) == out / "quick"
    assert runner.destination(out / "quick", True, True) == out / "quick"


def test_arguments_after_a_double_dash_go_to_the_benchmark():
    assert runner.argv_of("long_chat", True, named=True, extra=("--cpu-reference",)) == \
        ["bench.long_chat", "--quick", "--cpu-reference"]


def test_the_browser_benchmarks_of_one_page_and_the_long_ones_are_benchmarks_the_runner_knows():
    assert set(runner.ONE_PAGE) <= set(runner.BENCHMARKS) and set(runner.LONG) <= set(runner.BENCHMARKS)
    assert runner.argv_of("concurrency", True) == ["bench.webgpu_engine", "--concurrency", "--quick"]


def test_save_writes_the_json_and_the_files_a_result_carries(tmp_path):
    result = {"benchmark": "app_dashboard", "screenshot": "shot.png",
              "files": {"shot.png": base64.b64encode(b"\x89PNG bytes").decode()}}
    runner.save(tmp_path / "quick", "app_dashboard", result)
    assert (tmp_path / "quick" / "shot.png").read_bytes() == b"\x89PNG bytes"
    assert json.loads((tmp_path / "quick" / "app_dashboard.json").read_text()) == \
        {"benchmark": "app_dashboard", "screenshot": "shot.png"}
    trace = {"benchmark": "kv_browser", "series": list(range(30_000))}  # over 100,000 characters: one line
    runner.save(tmp_path, "kv_browser", trace)
    assert (tmp_path / "kv_browser.json").read_text() == json.dumps(trace) + "\n"

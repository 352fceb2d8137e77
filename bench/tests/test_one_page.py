"""`python3 -m bench` runs the browser benchmarks in one booted page (bench/harness/one_page.py): each gets the
same page from bench.harness.session(), a failing one is reported while the rest still run, and a benchmark's CPU side
can drive the engine synchronously although Playwright's event loop runs in that thread."""
from __future__ import annotations

import json

import pytest

import build

FAKE_A = '''
import json
from bench.harness import session
from pagedkv.engine import run_sync


async def seven():
    return 7


def main(argv):
    with session() as page:
        page.py("_one_page_mark = 41\\nNone")
        mark = page.py("import json\\njson.dumps(_one_page_mark + 1)")
    print("progress lines before the JSON are fine")
    print(json.dumps({"argv": argv, "mark": mark, "cpu": run_sync(seven())}, indent=1))
'''

FAKE_B = '''
import json
from bench.harness import session


def main(argv):
    with session() as page:  # the page FAKE_A left its mark in
        print(json.dumps({"mark": page.py("import json\\njson.dumps(_one_page_mark)")}))
'''

FAKE_FAILS = '''
from bench.harness import session


def main(argv):
    with session() as page:
        page.py("raise ValueError('this benchmark breaks')")
'''

FAKE_EXITS = '''
def main(argv):
    raise SystemExit("this benchmark exits: node_modules is missing")
'''


@pytest.fixture()
def fake_benchmarks(tmp_path, monkeypatch):
    import bench.__main__ as runner

    for name, text in (("fake_bench_a", FAKE_A), ("fake_bench_b", FAKE_B), ("fake_bench_fails", FAKE_FAILS),
                       ("fake_bench_exits", FAKE_EXITS)):
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.setitem(runner.BENCHMARKS, name, [name, "--flag"])
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    if not (build.DIST / "index.html").exists():
        build.build()
    return runner


def test_benchmarks_share_one_page_and_a_failure_does_not_stop_the_rest(fake_benchmarks, tmp_path):
    names = ["fake_bench_a", "fake_bench_fails", "fake_bench_exits", "fake_bench_b"]
    jobs = [(name, fake_benchmarks.argv_of(name, True), tmp_path / f"{name}.json") for name in names]
    rows = dict(fake_benchmarks.run_in_one_page(jobs, True, tmp_path / "results"))
    assert list(rows) == names
    a, b = rows["fake_bench_a"], rows["fake_bench_b"]
    assert {k: a[k] for k in ("argv", "mark", "cpu", "benchmark", "quick")} == \
        {"argv": ["--flag", "--quick"], "mark": 42, "cpu": 7, "benchmark": "fake_bench_a", "quick": True}
    assert b["mark"] == 41 and a["wall_s"] >= 0
    for name, why in (("fake_bench_fails", "this benchmark breaks"), ("fake_bench_exits", "node_modules is missing")):
        assert isinstance(rows[name], RuntimeError) and why in str(rows[name]), name
    json.dumps([a, b])  # what python3 -m bench writes

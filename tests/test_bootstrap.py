"""bootstrap.py: what `npm start` / `npm test` install before they run, and when they install it again."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bootstrap


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    """A project root with requirement files and a venv that has pip; `run` records commands instead."""
    for name, text in {"requirements.txt": "numpy\n", "requirements-dev.txt": "-r requirements.txt\npytest\n",
                       "py/pyproject.toml": "[project]\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "pip").write_text("")
    monkeypatch.setattr(bootstrap, "ROOT", tmp_path)
    monkeypatch.setattr(bootstrap, "VENV", venv)
    monkeypatch.setattr(bootstrap, "VENV_PYTHON", venv / "bin" / "python")
    monkeypatch.setattr(bootstrap, "STAMP", venv / "pagedkv-requirements.json")
    commands = []
    monkeypatch.setattr(bootstrap, "run", lambda cmd, **kwargs: commands.append(cmd[3:] if "pip" in cmd else cmd))
    return tmp_path, commands


PIP = ["install", "-q", "--disable-pip-version-check", "-r"]


def test_requirements_install_once_then_again_only_when_a_file_changes(tree):
    root, commands = tree
    bootstrap.ensure_python_packages(bootstrap.RUNTIME)
    bootstrap.ensure_python_packages(bootstrap.RUNTIME)
    assert commands == [PIP + ["requirements.txt"]]
    bootstrap.ensure_python_packages(bootstrap.DEV)
    bootstrap.ensure_python_packages(bootstrap.RUNTIME)  # the dev set holds the runtime set
    assert commands == [PIP + ["requirements.txt"], PIP + ["requirements-dev.txt"]]
    (root / "py/pyproject.toml").write_text("[project]\ndependencies = ['numpy']\n")
    bootstrap.ensure_python_packages(bootstrap.RUNTIME)  # a venv that had the dev set keeps it current
    assert commands[2:] == [PIP + ["requirements-dev.txt"]]
    assert json.loads(bootstrap.STAMP.read_text()) == {"digest": bootstrap.requirements_digest(),
                                                       "installed": "requirements-dev.txt"}


def test_node_modules_are_current_when_they_hold_what_the_lock_pins(tree):
    root, _ = tree
    pins = {"node_modules/pyodide": {"version": "0.27.7"}}
    (root / "package-lock.json").write_text(json.dumps({"packages": {"": {"name": "pagedkv"}, **pins}}))
    assert not bootstrap.node_modules_current()  # no node_modules at all
    (root / "node_modules").mkdir()
    installed = root / "node_modules" / ".package-lock.json"
    installed.write_text(json.dumps({"packages": {"node_modules/pyodide": {"version": "0.27.6"}}}))
    assert not bootstrap.node_modules_current()
    installed.write_text(json.dumps({"packages": pins}))
    assert bootstrap.node_modules_current()


def test_optional_packages_of_other_platforms_are_not_missing(tree):
    root, _ = tree
    linux = {"node_modules/@esbuild/linux-x64": {"version": "0.28.2", "optional": True, "os": ["linux"]}}
    pins = {"node_modules/esbuild": {"version": "0.28.2"}, **linux}
    darwin = {"node_modules/@esbuild/darwin-arm64": {"version": "0.28.2", "optional": True, "os": ["darwin"]}}
    (root / "package-lock.json").write_text(json.dumps({"packages": {"": {}, **pins, **darwin}}))
    (root / "node_modules").mkdir()
    installed = root / "node_modules" / ".package-lock.json"
    installed.write_text(json.dumps({"packages": pins}))
    assert bootstrap.node_modules_current()  # npm skipped darwin's binary
    installed.write_text(json.dumps({"packages": linux}))
    assert not bootstrap.node_modules_current()  # esbuild itself is missing


def test_missing_apt_packages_without_root_give_the_exact_command(tree, monkeypatch):
    _, commands = tree
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 1000)
    needs = (bootstrap.AptPackage("chromium", "the browser", lambda: False),
             bootstrap.AptPackage("mesa-vulkan-drivers", "Vulkan", lambda: False),
             bootstrap.AptPackage("curl", "present", lambda: True))
    with pytest.raises(bootstrap.BootstrapError) as err:
        bootstrap.ensure_apt(needs)
    assert "    sudo apt-get update && sudo apt-get install -y chromium mesa-vulkan-drivers\n" in str(err.value)
    assert "chromium: the browser; mesa-vulkan-drivers: Vulkan" in str(err.value) and commands == []


def test_missing_apt_packages_as_root_are_installed(tree, monkeypatch):
    _, commands = tree
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 0)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: f"/usr/bin/{name}")
    bootstrap.ensure_apt((bootstrap.AptPackage("chromium", "the browser", lambda: False),))
    assert commands == [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]]


def test_a_venv_without_ensurepip_installs_debians_venv_package_and_retries(tree, monkeypatch):
    _, commands = tree
    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: 0)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: f"/usr/bin/{name}")
    no_ensurepip = subprocess.CompletedProcess([], 1, "The virtual environment was not successfully created "
                                                      "because ensurepip is not available.\n", "")
    monkeypatch.setattr(bootstrap.subprocess, "run", lambda cmd, **kwargs: no_ensurepip)
    bootstrap.create_venv()
    package = f"python3.{sys.version_info.minor}-venv"
    assert commands == [["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package],
                        [sys.executable, "-m", "venv", str(bootstrap.VENV)]]
    assert not bootstrap.VENV.exists()  # the half-made one was removed before the retry


@pytest.mark.parametrize("args, expected", [
    ([], ["tests", "bench/tests", "--durations=30"]),
    (["-k", "serve"], ["tests", "bench/tests", "--durations=30", "-k", "serve"]),
    (["--durations=5"], ["tests", "bench/tests", "--durations=5"]),
    (["tests/test_build.py", "-x"], ["tests/test_build.py", "-x"]),
    (["tests/test_serve.py::test_csp_allows_wasm_but_not_eval", "-q"],
     ["tests/test_serve.py::test_csp_allows_wasm_but_not_eval", "-q"]),
])
def test_pytest_runs_every_test_unless_told_which(args, expected):
    assert bootstrap.pytest_args(args) == ["-m", "pytest", *expected]


@pytest.mark.parametrize("args, env, expected", [
    ([], None, True), (["-k", "serve"], None, True), (["tests/test_build.py", "-x"], None, False),
    (["tests/test_serve.py::test_csp_allows_wasm_but_not_eval"], None, False), ([], "1", False)])
def test_the_whole_suite_runs_in_two_lanes_unless_a_path_is_named_or_one_lane_asked(args, env, expected,
                                                                                    monkeypatch):
    if env is None:
        monkeypatch.delenv("PAGEDKV_TEST_LANES", raising=False)
    else:
        monkeypatch.setenv("PAGEDKV_TEST_LANES", env)
    assert bootstrap.lanes_wanted(args) is expected


@pytest.fixture()
def lanes(tmp_path, monkeypatch):
    """Two lanes of real pytest runs over test files written here; returns a function that writes a lane's file."""
    monkeypatch.setattr(bootstrap, "ROOT", tmp_path)
    monkeypatch.setattr(bootstrap, "VENV_PYTHON", sys.executable)
    monkeypatch.setattr(bootstrap, "LANES_DIR", tmp_path / ".cache" / "test-lanes")
    monkeypatch.setattr(bootstrap, "LANES", (("one", ["one"]), ("two", ["two"])))
    monkeypatch.setattr(bootstrap, "venv_env", lambda: dict(__import__("os").environ))

    def write(lane: str, body: str) -> None:
        (tmp_path / lane).mkdir(exist_ok=True)
        (tmp_path / lane / f"test_{lane}.py").write_text(body)
    return write


def test_two_lanes_add_up_their_counts_and_fail_when_either_fails(lanes, capsys):
    lanes("one", "def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    lanes("two", "def test_c():\n    pass\n")
    assert bootstrap.run_lanes(["-q", "-p", "no:cacheprovider"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == "total: 3 passed, 0 failed"
    assert "== the two lane's output ==" in out
    lanes("two", "def test_c():\n    assert False\n\ndef test_d():\n    pass\n")
    assert bootstrap.run_lanes(["-q", "-p", "no:cacheprovider"]) == 1
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == "total: 3 passed, 1 failed"


def test_a_lane_that_selects_nothing_is_not_a_failure_unless_both_do(lanes, capsys):
    lanes("one", "def test_serve():\n    pass\n")
    lanes("two", "def test_other():\n    pass\n")
    assert bootstrap.run_lanes(["-q", "-p", "no:cacheprovider", "-k", "serve"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == "total: 1 passed, 0 failed"
    assert bootstrap.run_lanes(["-q", "-p", "no:cacheprovider", "-k", "nothing_at_all"]) == 5

#!/usr/bin/env python3
"""Install what a command needs, then run it: what `npm start`, `npm test`, `npm run ...` call.

    python3 bootstrap.py start [serve.py args]   npm packages, requirements.txt in .venv/, build dist/, serve it
    python3 bootstrap.py test [pytest args]      also requirements-dev.txt and the apt packages; build; pytest
    python3 bootstrap.py build                   npm packages, requirements.txt, build dist/
    python3 bootstrap.py bench|generate [args]   as test, then `python -m bench` / `python -m pagedkv.generate`

Standard library only, so that it runs under a bare python3 before anything is installed. Python packages
live in the project's own virtual environment, .venv/: reused, and pip runs again when requirements*.txt or
py/pyproject.toml change (a stamp file in .venv/ holds their hash). `npm ci` runs when node_modules does not
hold exactly what package-lock.json pins.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
STAMP = VENV / "pagedkv-requirements.json"
RUNTIME, DEV = "requirements.txt", "requirements-dev.txt"  # requirements-dev.txt includes requirements.txt
# Everything pip reads: a change to any of them reinstalls.
REQUIREMENT_INPUTS = (RUNTIME, DEV, "py/pyproject.toml")


class BootstrapError(Exception):
    """Something this script cannot install by itself; the message gives the command that does."""


def log(message: str) -> None:
    print(f"== {message}", flush=True)


def run(cmd: list[str], **kwargs) -> None:
    proc = subprocess.run(cmd, **kwargs)
    if proc.returncode != 0:
        raise BootstrapError(f"`{' '.join(map(str, cmd))}` failed (exit code {proc.returncode}); see above.")


# --------------------------------------------------------------------------- apt


def dpkg_installed(package: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return False
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout == "install ok installed"


def chromium_found() -> bool:
    from harness.chromium import find_chromium  # standard library only at import time, like this file

    try:
        find_chromium()
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class AptPackage:
    """A system package a command needs; `present` says whether this machine already has it."""

    name: str
    why: str
    present: Callable[[], bool]


# What `npm test` (and the browser benchmarks) need from the system.
TEST_APT = (
    AptPackage("chromium", "the browser tests drive it through Playwright (or set CHROME_PATH)", chromium_found),
    AptPackage("mesa-vulkan-drivers", "tests/native run the WGSL kernels on wgpu-py over its lavapipe (a CPU Vulkan)",
               lambda: dpkg_installed("mesa-vulkan-drivers")),
)


def ensure_apt(packages: tuple[AptPackage, ...]) -> None:
    """Install the missing ones with apt-get when running as root; otherwise say the exact command."""
    missing = [p for p in packages if not p.present()]
    if not missing:
        return
    names = " ".join(p.name for p in missing)
    reasons = "; ".join(f"{p.name}: {p.why}" for p in missing)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BootstrapError(f"missing system packages ({reasons}). Install them with:\n"
                             f"    sudo apt-get update && sudo apt-get install -y {names}\nthen run this again.")
    log(f"apt-get install {names} ({reasons})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", *names.split()], env=env)


# --------------------------------------------------------------------------- npm


def node_modules_current() -> bool:
    """True when node_modules holds exactly what package-lock.json pins (npm's own record of what it installed)."""
    installed = ROOT / "node_modules" / ".package-lock.json"
    if not installed.is_file():
        return False
    have = json.loads(installed.read_text())["packages"]
    wanted = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    # npm installs an optional package only for the platform it names (esbuild's one binary of @esbuild/*)
    return have == {k: v for k, v in wanted.items() if k and (k in have or not v.get("optional"))}


def ensure_node_modules() -> None:
    if node_modules_current():
        return
    if shutil.which("npm") is None:
        raise BootstrapError("npm is missing: install Node.js 20+ (`sudo apt-get install -y nodejs npm`).")
    log("npm ci")
    run(["npm", "ci", "--no-audit", "--no-fund"], cwd=ROOT)


# --------------------------------------------------------------------------- Python


def venv_package() -> str:
    """Debian's package that gives this python3 its ensurepip (and so `python3 -m venv`)."""
    return f"python3.{sys.version_info.minor}-venv"


def create_venv() -> None:
    log(f"creating {VENV.relative_to(ROOT)}/ with {sys.executable}")
    proc = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
    if proc.returncode == 0:
        return
    shutil.rmtree(VENV, ignore_errors=True)  # a half-made venv (no pip) would pass for a good one next time
    output = proc.stdout + proc.stderr
    if "ensurepip" not in output:
        raise BootstrapError(f"`{sys.executable} -m venv {VENV}` failed:\n{output.strip()}")
    package = AptPackage(venv_package(), "python3 -m venv needs ensurepip", lambda: False)
    ensure_apt((package,))
    run([sys.executable, "-m", "venv", str(VENV)])


def requirements_digest() -> str:
    h = hashlib.sha256()
    for name in REQUIREMENT_INPUTS:
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return h.hexdigest()


def read_stamp() -> dict:
    return json.loads(STAMP.read_text()) if STAMP.is_file() else {}


def ensure_python_packages(need: str) -> None:
    """.venv/ holds `need` (RUNTIME or DEV) as the requirement files read now; installs only what changed."""
    if not (VENV / "bin" / "pip").exists():
        create_venv()
    digest, stamp = requirements_digest(), read_stamp()
    # A venv that once got the dev set keeps getting it, so `npm start` after `npm test` reinstalls nothing.
    target = DEV if DEV in (need, stamp.get("installed")) else RUNTIME
    if stamp == {"digest": digest, "installed": target}:
        return
    log(f"pip install -r {target} into {VENV.relative_to(ROOT)}/")
    run([str(VENV_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", target], cwd=ROOT)
    STAMP.write_text(json.dumps({"digest": digest, "installed": target}) + "\n")


# --------------------------------------------------------------------------- commands


def venv_env() -> dict[str, str]:
    """The environment of an activated .venv/, so that subprocesses calling `python3` get it too."""
    path = f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "VIRTUAL_ENV": str(VENV), "PATH": path}
    env.pop("PYTHONHOME", None)
    return env


def python(args: list[str]) -> None:
    run([str(VENV_PYTHON), *args], cwd=ROOT, env=venv_env())


def exec_python(args: list[str]) -> None:
    """Become `.venv/bin/python args`: its exit code and Ctrl+C are the command's own."""
    sys.stdout.flush()
    os.chdir(ROOT)
    os.execve(str(VENV_PYTHON), [str(VENV_PYTHON), *args], venv_env())


def names_a_test_path(args: list[str]) -> bool:
    """Whether the pytest arguments name a test file, folder or `file::test` of their own."""
    return any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in args)


def pytest_args(args: list[str]) -> list[str]:
    """`tests` and bench's own tests (bench/tests) unless the arguments name a test path themselves
    (`npm test -- tests/test_build.py -x`), with the slowest tests listed when the whole suite runs."""
    names_a_path = names_a_test_path(args)
    # The whole suite lists its 30 slowest tests: the 35-minute budget is kept by reading that list.
    durations = [] if names_a_path or any(a.startswith("--durations") for a in args) else ["--durations=30"]
    return ["-m", "pytest", *([] if names_a_path else ["tests", "bench/tests"]), *durations, *args]


# The whole suite runs as two pytest processes at once, each a lane with its own Chromium where it needs one.
# One after the other the tests took 37:35 on a quiet machine here: the browser tests 28:40 of it (Chromium keeps
# ~1.4 of the 2 cores busy), the rest 8:50 (CPython, and wgpu-py on lavapipe: mostly one core). The browser tests
# of kernels and of the engine on the tests' page (no chat in the UI, nothing timed) run in the second lane, which
# evens the two out. A fresh machine's first run also compiles every kernel variant on lavapipe (Mesa's shader
# cache, ~/.cache/mesa_shader_cache, is empty): at e5ecfb6 a fresh clone with an empty cache took 29.3 min in the
# browser lane and 33.8 in the other, so three pages moved to the browser lane. The files both lanes write (model
# conversions, llama.cpp's references, test GGUFs) are written whole or not at all. PAGEDKV_TEST_LANES=1 runs the
# suite in one process, as a named path or `::` test always does.
SECOND_LANE_PAGES = ("test_model_kernels.py", "test_kv_kernels.py", "test_kv_window_attention.py",
                     "test_webgpu_engine.py")
LANES = (("browser", ["tests/browser", *(f"--ignore=tests/browser/{name}" for name in SECOND_LANE_PAGES)]),
         # (an --ignore=tests/browser would drop the pages named here too: the lane names its paths)
         ("cpython", [*(f"tests/browser/{name}" for name in SECOND_LANE_PAGES), "tests/native",
                      *sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")), "bench/tests"]))
LANES_DIR = ROOT / ".cache" / "test-lanes"


def lanes_wanted(args: list[str]) -> bool:
    return not names_a_test_path(args) and os.environ.get("PAGEDKV_TEST_LANES", "2") != "1"


def lane_argv(name: str, paths: list[str], args: list[str]) -> list[str]:
    durations = [] if any(a.startswith("--durations") for a in args) else ["--durations=20"]
    return ["-m", "pytest", *paths, *durations, f"--junitxml={LANES_DIR / name}.xml", *args]


def lane_counts(name: str) -> tuple[int, int] | None:
    """(passed, failed or errored) from a lane's JUnit file; None when it wrote none."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(LANES_DIR / f"{name}.xml").getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = lambda key: sum(int(x.get(key, 0)) for x in suites)  # noqa: E731
    bad = total("failures") + total("errors")
    return total("tests") - bad - total("skipped"), bad


def run_lanes(args: list[str]) -> int:
    """Both lanes at once: the browser lane's output as it comes, the other lane's after it, then the two lanes'
    counts added up on the last line. The exit code is 0 only when both lanes passed (pytest's 5, no test
    selected, counts as passed in a lane while the other lane ran tests)."""
    import time

    LANES_DIR.mkdir(parents=True, exist_ok=True)
    for name, _ in LANES:
        (LANES_DIR / f"{name}.xml").unlink(missing_ok=True)
    (first, first_paths), (second, second_paths) = LANES
    log(f"two lanes at once: {first} here, {second} into {(LANES_DIR / second).relative_to(ROOT)}.log, shown when "
        "both end (PAGEDKV_TEST_LANES=1: one lane)")
    sys.stdout.flush()
    env, t0 = venv_env(), time.monotonic()
    with open(LANES_DIR / f"{second}.log", "w") as second_log:
        procs = {first: subprocess.Popen([str(VENV_PYTHON), *lane_argv(first, first_paths, args)], cwd=ROOT, env=env),
                 second: subprocess.Popen([str(VENV_PYTHON), *lane_argv(second, second_paths, args)], cwd=ROOT,
                                          env=env, stdout=second_log, stderr=subprocess.STDOUT)}
        ended = {}
        try:
            while len(ended) < len(procs):
                for name, proc in procs.items():
                    if name not in ended and proc.poll() is not None:
                        ended[name] = (proc.returncode, time.monotonic() - t0)
                time.sleep(0.5)
        except KeyboardInterrupt:
            for proc in procs.values():
                proc.terminate()
            raise
    print(f"\n== the {second} lane's output ==", flush=True)
    sys.stdout.write((LANES_DIR / f"{second}.log").read_text(errors="replace"))
    passed = failed = 0
    codes = []
    for name, _ in LANES:
        code, seconds = ended[name]
        counts = lane_counts(name)
        print(f"== lane {name}: exit code {code} after {seconds / 60:.1f} min, "
              f"{'no JUnit report' if counts is None else f'{counts[0]} passed, {counts[1]} failed'}")
        if counts is None:
            failed += 1  # a lane that reported nothing did not pass
        else:
            passed, failed = passed + counts[0], failed + counts[1]
        codes.append(code)
    print(f"total: {passed} passed, {failed} failed", flush=True)
    if all(c == 5 for c in codes):
        return 5
    bad = [c for c in codes if c not in (0, 5)]
    return bad[0] if bad else (1 if failed else 0)


def prepare(need: str, apt: tuple[AptPackage, ...] = ()) -> None:
    ensure_node_modules()
    ensure_python_packages(need)
    ensure_apt(apt)


def main(argv: list[str]) -> int:
    commands = ("start", "test", "build", "bench", "generate")
    if not argv or argv[0] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    try:
        if command in ("start", "build"):
            prepare(RUNTIME)
            python(["build.py"])
            if command == "start":
                exec_python(["serve.py", *args])
            return 0
        prepare(DEV, TEST_APT)
        if command == "test":
            python(["build.py"])
            if lanes_wanted(args):
                return run_lanes(args)
            exec_python(pytest_args(args))
        # Both build dist/ themselves (the runner once for all benchmarks).
        exec_python(["-m", "bench" if command == "bench" else "pagedkv.generate", *args])
    except BootstrapError as exc:
        print(f"bootstrap.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

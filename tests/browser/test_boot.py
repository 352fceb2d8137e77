"""The page boots in real headless Chromium with real WebGPU (SwiftShader here) and says so."""
from __future__ import annotations

from urllib.parse import urlparse

import numpy as np

from browser_pages import open_and_boot, wait_model


def test_page_boots_and_reports_adapter(ready_page):
    data = ready_page.dataset()
    assert data["state"] == "ready"
    assert ready_page.page.locator("#device").is_visible()
    assert not ready_page.page.locator("#error").is_visible()
    adapter = ready_page.page.evaluate("JSON.parse(document.documentElement.dataset.adapter)")
    limits = adapter["limits"]
    # The device was requested with the adapter's real limits, well above WebGPU's 128/256 MiB defaults here.
    assert limits["maxBufferSize"] >= 256 * 2**20
    assert limits["maxStorageBufferBindingSize"] >= 128 * 2**20
    assert ready_page.page.locator("#limit-max-binding").inner_text() == f"{limits['maxStorageBufferBindingSize']:,} bytes"
    assert adapter["name"] == ready_page.page.locator("#adapter-name").inner_text()
    # ?kernels=auto (the default) picks the cpu family on SwiftShader and says why beside the adapter.
    reason = f"auto: {adapter['name']} is a software adapter (isFallbackAdapter, swiftshader)"
    assert (adapter["kernels"], adapter["kernels_reason"]) == ("cpu", reason)
    assert ready_page.page.locator("#adapter-kernels").inner_text() == f"cpu ({reason})"
    # ?backend=auto (the default) follows the same rule: the numpy path here, and the page says why.
    why = f"{reason}: numpy in the tab decodes faster there"
    assert (adapter["backend"], adapter["backend_reason"]) == ("cpu", why)
    assert ready_page.page.locator("#adapter-backend").inner_text() == f"cpu ({why})"


def test_selftest_kernel_matches_numpy_computed_here(ready_page):
    selftest = ready_page.page.evaluate("JSON.parse(document.documentElement.dataset.selftest)")
    # Same generator and seed as pagedkv.backends.webgpu.self_test, computed independently in CPython.
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_003, dtype=np.float32)
    y = rng.standard_normal(100_003, dtype=np.float32)
    assert selftest["kernel"] == "residual_add"
    assert selftest["max_abs_err"] == 0
    assert selftest["checksum"] == float((x + y).sum(dtype=np.float64))


def test_python_runs_in_the_worker_with_numpy(ready_page):
    info = ready_page.py(
        "import json, sys, numpy, pagedkv, jinja2\n"
        "json.dumps({'py': sys.version_info[:2], 'numpy': numpy.__version__, 'engine': pagedkv.__version__,"
        " 'platform': sys.platform, 'jinja2': jinja2.Template('{{ a }}+{{ b }}').render(a=1, b=2)})"
    )
    assert info == {"py": [3, 12], "numpy": "2.0.2", "engine": "0.1.0", "platform": "emscripten", "jinja2": "1+2"}


def test_wheel_was_installed_by_micropip_not_copied(ready_page):
    installer = ready_page.py(
        "import json, importlib.metadata as md\n"
        "json.dumps({d: (md.distribution(d).read_text('INSTALLER') or '').strip() for d in ('pagedkv', 'pagedkv_app')})"
    )
    assert installer == {"pagedkv": "micropip", "pagedkv_app": "micropip"}


def test_every_request_stays_on_this_origin_and_succeeds(ready_page, base_url):
    origin = urlparse(base_url).netloc
    assert ready_page.responses, "no responses recorded"
    for status, url in ready_page.responses:
        assert urlparse(url).netloc == origin, url
        assert status < 400, (status, url)


def test_page_is_cross_origin_isolated(ready_page):
    assert ready_page.page.evaluate("window.crossOriginIsolated") is True


def test_no_webgpu_says_so_plainly_and_chats_on_the_cpu_fallback(browser_without_webgpu, base_url):
    booted = open_and_boot(browser_without_webgpu, base_url + "?model=tiny-random")
    try:
        data = booted.dataset()
        assert data["state"] == "ready" and data["webgpu"] == "unavailable"
        page = booted.page
        message = page.locator("#gpu-notice-message").inner_text()
        assert page.locator("#gpu-notice").is_visible() and not page.locator("#error").is_visible()
        assert "no GPU adapter" in message or "does not expose WebGPU" in message
        assert "Chrome" in message and "113" in message
        assert "Traceback" not in message
        info = wait_model(booted)
        assert info["backend"] == "cpu"
        assert "CPU fallback" in page.locator("#chat-status").inner_text()
        page.fill("#prompt", "hello")
        page.press("#prompt", "Enter")
        page.wait_for_selector("html[data-last-turn]", state="attached")
        assert page.locator("#messages .msg.assistant").count() == 1
    finally:
        booted.page.close()

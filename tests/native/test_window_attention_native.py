"""tests/browser/test_kv_window_attention.py on wgpu-py (tests/native/conftest.py)."""
from native_harness import browser_tests

globals().update(browser_tests("test_kv_window_attention"))

"""tests/browser/test_mixed_weights_webgpu.py on wgpu-py (tests/native/conftest.py)."""
from native_harness import browser_tests

globals().update(browser_tests("test_mixed_weights_webgpu"))

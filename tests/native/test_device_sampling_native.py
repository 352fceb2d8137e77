"""tests/browser/test_device_sampling.py on wgpu-py (tests/native/conftest.py)."""
from native_harness import browser_tests

globals().update(browser_tests("test_device_sampling"))

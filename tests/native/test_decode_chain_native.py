"""tests/browser/test_decode_chain.py on wgpu-py (tests/native/conftest.py)."""
from native_harness import browser_tests

globals().update(browser_tests("test_decode_chain"))

"""tests/browser/test_kv_disk_gpu.py on wgpu-py (tests/native/conftest.py); the OPFS listing case needs the
browser's origin private file system, so it runs in Chromium only."""
from native_harness import browser_tests

OPFS_ONLY = ("test_opfs_listing_survives_writes_and_deletes_in_flight",)
globals().update(browser_tests("test_kv_disk_gpu", except_=OPFS_ONLY))

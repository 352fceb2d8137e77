"""tests/browser/test_kv_disk_gpu.py on wgpu-py (tests/native/conftest.py); the OPFS listing cases need the
browser's origin private file system, so they run in Chromium only."""
from native_harness import browser_tests

OPFS_ONLY = ("test_opfs_listing_survives_writes_and_deletes_in_flight",
             "test_opfs_listing_is_tried_again_when_the_iterator_fails",
             "test_opfs_store_takes_its_directory_again_when_the_handle_fails",
             "test_opfs_write_never_raises_when_its_file_is_deleted_meanwhile")
globals().update(browser_tests("test_kv_disk_gpu", except_=OPFS_ONLY))

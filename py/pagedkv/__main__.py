"""`python3 -m pagedkv ...`: see pagedkv.cli."""

import sys

from .cli import main

sys.exit(main())

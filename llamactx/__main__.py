"""`python -m llamactx` = the `llamactx` command."""

import sys

from llamactx.cli import main

sys.exit(main())

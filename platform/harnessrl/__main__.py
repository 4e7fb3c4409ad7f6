"""`python -m harnessrl` is the `harnessrl` command."""

import sys

from harnessrl.cli import main

sys.exit(main())

"""``python -m eggfuse``: the command line (:func:`eggfuse.cli.main`), as the ``eggfuse`` script."""

import sys

from eggfuse.cli import main

sys.exit(main())

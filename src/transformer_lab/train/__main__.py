"""``python -m transformer_lab.train``: see :mod:`transformer_lab.train.cli`."""

import sys

from transformer_lab.train.cli import main

sys.exit(main())

"""``python -m fedjax_sel`` runs the ``fedjax-sel`` command line."""

import sys

from fedjax_sel.cli.main import main

sys.exit(main())

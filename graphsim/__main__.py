"""``python -m graphsim``: the command line."""
import sys

from graphsim.cli import main

sys.exit(main())

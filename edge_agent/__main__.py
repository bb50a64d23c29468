"""``python -m edge_agent --config FILE`` = ``raven agent --config FILE``."""

import sys

from raven_cli.main import main

sys.exit(main(["agent", *sys.argv[1:]]))

"""``python -m cloud_gateway --config FILE`` = ``raven gateway --config FILE``."""

import sys

from raven_cli.main import main

sys.exit(main(["gateway", *sys.argv[1:]]))

import sys

from retrysim.cli.main import main

sys.exit(main())

import sys

from retrysim.cli import main

sys.exit(main())

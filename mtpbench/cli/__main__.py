import sys

from mtpbench.cli import main

sys.exit(main())

import sys

from tinylauncher.cli import main

sys.exit(main())

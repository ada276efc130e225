import sys

from clusterjob.cli import main

sys.exit(main())

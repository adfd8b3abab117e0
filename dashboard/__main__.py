import sys

from dashboard.app import main

sys.exit(main())

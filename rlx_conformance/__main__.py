import sys

from rlx_conformance.cli.main import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m hybridcache.cli`: the same as the `hybridcache` command."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m oneknob.compare`: the comparison of a sweep, rebuilt from MLflow (oneknob.explain.compare)."""

import sys

from oneknob.explain.compare import main

if __name__ == "__main__":
    sys.exit(main())

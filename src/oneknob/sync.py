"""`python -m oneknob.sync`: upload to MLflow what a job's journal holds and MLflow lacks (oneknob.record.sync)."""

import sys

from oneknob.record.sync import main

if __name__ == "__main__":
    sys.exit(main())

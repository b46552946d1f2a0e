"""Plan or run an architecture search at a fixed parameter budget (SPEC.md "Command lines").

    python run_search.py [SPACE.yaml] --budget 113M --plan [--json]
"""

import sys

from benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())

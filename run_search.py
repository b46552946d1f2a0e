"""Plan or run an architecture search at a fixed parameter budget: `shapebench plan` and
`shapebench search` under their older name (the flags: --help, or docs/searches-and-results.md).

    python run_search.py [SPACE.yaml] --budget 113M --plan [--json]
    python run_search.py [SPACE.yaml] --budget 113M
"""

import sys

from benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())

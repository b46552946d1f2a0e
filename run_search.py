"""`shapebench search` (and `shapebench plan` with --plan) under its older name."""

import sys

from benchmark.main import main

if __name__ == "__main__":  # --plan picks the verb; every other flag is the command's own
    argv = sys.argv[1:]
    sys.exit(
        main(
            ["plan", *(a for a in argv if a != "--plan")] if "--plan" in argv else ["search", *argv]
        )
    )

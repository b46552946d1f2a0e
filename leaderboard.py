#!/usr/bin/env python
"""`shapebench board` under its older name."""

import sys

from benchmark.main import main

if __name__ == "__main__":
    sys.exit(main(["board", *sys.argv[1:]]))

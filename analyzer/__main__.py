"""`python -m analyzer`: the command line lives in analyzer.cli."""
import sys

from analyzer.cli import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    sys.exit(run())

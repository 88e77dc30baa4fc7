import sys

from maze_evaluator.cli import main

sys.exit(main())

import sys

from training_operator.cli import main

sys.exit(main())

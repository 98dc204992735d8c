"""`python -m glassllm.cli ...`: the `glassllm` command."""
import sys

from . import main

sys.exit(main())

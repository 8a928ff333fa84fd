"""``python -m pccl_torch.testbed``: the pccl-testbed command."""

import sys

from pccl_torch.testbed.cli import main

sys.exit(main())

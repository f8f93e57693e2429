"""``python -m topi_bn.bench``: the same as ``topi-bn bench``."""
import sys

from .cli import main

sys.exit(main())

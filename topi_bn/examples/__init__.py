"""Runnable examples: ``python -m topi_bn.examples.<name>``."""

"""ARM (aarch64 NEON) registration of the CPU schedules.

The schedules are ``cpu.py``'s, shared with x86: the vector width (128-bit NEON: 4 float32
lanes), register count and cores are read from the target, so no ARM copy of them exists.
SVE targets use the NEON width (``targets.vector_bits``) and build the same code.
"""
from . import common, cpu
from topi_bn.targets import resolve_target

common.register_family(cpu, {"arm_cpu": lambda: resolve_target("arm")}, "cpu")

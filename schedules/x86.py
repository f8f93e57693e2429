"""x86 registration of the CPU schedules: MetaSchedule target key ``cpu``.

Every knob of :mod:`topi_bn.schedules.cpu` is read from the target (vector lanes, cores), so
this module only names the key and its default target (this machine's CPU).
"""
from topi_bn.targets import resolve_target

from . import cpu as cpu_module
from .common import register_family

register_family(cpu_module, {"cpu": lambda: resolve_target("x86")}, "cpu")

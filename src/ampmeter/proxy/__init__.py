"""A metering proxy for agents in any language: ``ampmeter proxy`` and ``ampmeter run --proxy``.

Needs the ``proxy`` extra (aiohttp). See :class:`MeteringProxy` and the budget file format in
:mod:`ampmeter.proxy.budget_file`.
"""

from ampmeter.proxy.budget_file import (
    BudgetFileError,
    CallerBudget,
    ProxyBudgets,
    read_budget_file,
)
from ampmeter.proxy.server import MeteringProxy

__all__ = ["BudgetFileError", "CallerBudget", "MeteringProxy", "ProxyBudgets", "read_budget_file"]

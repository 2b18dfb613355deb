"""Budgets shared beyond one process: the ledger step of the admission, and hand-offs
(a context handing part of its run to another process)."""

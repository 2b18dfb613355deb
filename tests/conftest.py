"""What every test needs, on the core install too: journals and the price index in a throwaway
directory, and the one local model server of the session.

Nothing imported here needs an SDK or an optional extra (tests/test_layout.py checks it): the
SDK clients, metering and replay fixtures are in the conftest.py of the folders that use them.
"""

from __future__ import annotations

import os
import tempfile

# One llama.cpp server for the whole session, whichever folders ask for it (the model loads only
# when a test does; the module imports nothing beyond the core).
pytest_plugins = ["support.local_model"]

# Ledger journals of the tests go to a throwaway directory, never to the user's cache.
_JOURNALS = tempfile.TemporaryDirectory(prefix="ampmeter-test-journals-")
os.environ["AMPMETER_JOURNAL_DIR"] = _JOURNALS.name
# The price index too (ampmeter/pricing/_cache.py).
os.environ["AMPMETER_CACHE_DIR"] = _JOURNALS.name

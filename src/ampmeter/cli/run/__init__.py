"""``ampmeter run`` (importing this package imports nothing else: every metered process imports
:mod:`.child`)."""

"""``ampmeter run``: the command (:mod:`.command`), its settings (:mod:`.config`), the parent
that starts the program and judges the run (:mod:`.parent`), the metering of each of the
program's processes (:mod:`.child`) and the ``sitecustomize`` that starts it (``_bootstrap``).

Importing this package imports nothing else: every metered process imports :mod:`.child`.
"""

"""The accounting core (private): usage, the kernel, compiled limit checks, the admission.

Data flows one way: a call's :class:`~ampmeter._core.usage.Usage` goes through the admission
admission (:mod:`ampmeter._core.steps`) into the kernel (:mod:`ampmeter._core.kernel`), the only
place where accounting state changes.
"""

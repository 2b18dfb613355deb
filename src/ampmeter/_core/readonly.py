"""Read-only attributes: the public face of a private one, written once for every class."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, overload

__all__ = ["ReadOnly"]

_T = TypeVar("_T")


class ReadOnly(property, Generic[_T]):
    """``x: ReadOnly[int] = ReadOnly("doc")`` in a class shows an instance's ``_x`` as ``x``, and
    refuses an assignment with an error that names ``x`` and says what to do instead (``hint``).
    A property reading the private attribute: a read runs no Python code, so the core's own
    objects (a call's kind, its reservation) can be read-only at no cost per call.
    """

    def __init__(
        self, doc: str, hint: str = "", *, of: str | Callable[..., Any] = "", at: int | None = None
    ) -> None:
        super().__init__(doc=doc)
        self.hint = hint
        # Where the value is kept, when not in ``_x`` (``"node.kind"``), or what makes it.
        self.of = of
        self.at = at  # its place in the tuple kept there, if it is one of several
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        kept = self.of if callable(self.of) else attrgetter(self.of or f"_{name}")
        place = self.at
        read: Callable[[Any], Any] = kept if place is None else lambda obj: kept(obj)[place]
        super().__init__(read, self._refuse, self._refuse, self.__doc__)

    def _refuse(self, obj: object, value: object = None) -> NoReturn:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is read-only{self.hint}")

    if TYPE_CHECKING:  # (types only: property's own __get__ reads)

        @overload
        def __get__(self, obj: None, owner: type | None = None) -> ReadOnly[_T]: ...

        @overload
        def __get__(self, obj: object, owner: type | None = None) -> _T: ...

        def __get__(self, obj: object | None, owner: type | None = None) -> ReadOnly[_T] | _T: ...

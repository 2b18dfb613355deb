"""Read-only attributes: the public face of a private one, written once for every class."""

from __future__ import annotations

from typing import Generic, NoReturn, TypeVar, overload

__all__ = ["ReadOnly"]

_T = TypeVar("_T")


class ReadOnly(Generic[_T]):
    """``x: ReadOnly[int] = ReadOnly("doc")`` in a class shows an instance's ``_x`` as ``x``, and
    refuses an assignment with an error that names ``x`` and says what to do instead (``hint``).
    """

    def __init__(self, doc: str, hint: str = "") -> None:
        self.__doc__ = doc
        self.hint = hint

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.slot = f"_{name}"

    @overload
    def __get__(self, obj: None, owner: type) -> ReadOnly[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...

    def __get__(self, obj: object | None, owner: type) -> ReadOnly[_T] | _T:
        if obj is None:
            return self
        value: _T = getattr(obj, self.slot)
        return value

    def __set__(self, obj: object, value: object) -> NoReturn:
        raise AttributeError(f"{type(obj).__name__}.{self.name} is read-only{self.hint}")

    def __delete__(self, obj: object) -> NoReturn:
        self.__set__(obj, None)

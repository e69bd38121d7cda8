"""Frozen dataclasses read from JSON and written back to it, without pydantic.

A worker needs two typed records — its run spec and how to launch its agent — and nothing of
the settings schema. Built with pydantic, those two cost the launcher's image (shared by every
forked worker) ~10 MiB of pydantic, pydantic_core and the settings models, and each fork its
own pages to validate and re-dump its spec (issue #35). This module is the small reader they
need instead: JSON types per field, the constraints a field's ``Annotated`` metadata states,
defaults for missing fields, unknown keys refused, and one error that names the field's path.

Supported field types: ``str``, ``int`` (never a bool), ``bool``, ``float``, ``X | None``,
``list[X]``, ``dict[str, X]``, ``Any`` (any JSON value), enums (by value) and nested
dataclasses. A dataclass may check what spans fields in ``__post_init__`` and raise
:class:`DataclassJsonError` with the field's path.

NB: the constraints are this module's own small classes, not ``annotated_types``: that package
imports ``typing_extensions`` at load (~0.9 MiB of private pages in every process that loads
it, measured) for four comparisons.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class MinLen:
    """A string, list or map at least this long."""

    min_length: int

    def problem(self, value: Any) -> str | None:
        if len(value) < self.min_length:
            return f"must have at least {self.min_length} item(s) or character(s)"
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class MaxLen:
    """A string, list or map at most this long."""

    max_length: int

    def problem(self, value: Any) -> str | None:
        if len(value) > self.max_length:
            return f"must have at most {self.max_length} item(s) or character(s)"
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Gt:
    """A number greater than this."""

    gt: int

    def problem(self, value: Any) -> str | None:
        return None if value > self.gt else f"must be greater than {self.gt}"


@dataclasses.dataclass(frozen=True, slots=True)
class Ge:
    """A number greater than or equal to this."""

    ge: int

    def problem(self, value: Any) -> str | None:
        return None if value >= self.ge else f"must be greater than or equal to {self.ge}"


@dataclasses.dataclass(frozen=True, slots=True)
class Le:
    """A number less than or equal to this."""

    le: int

    def problem(self, value: Any) -> str | None:
        return None if value <= self.le else f"must be less than or equal to {self.le}"


Constraint = MinLen | MaxLen | Gt | Ge | Le


class DataclassJsonError(ValueError):
    """A JSON value that does not fit its dataclass: ``path`` names the field (``issue.id``,
    ``continuation_prompts.3``; empty for the document itself)."""

    def __init__(self, message: str, *, path: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    @property
    def where(self) -> str:
        return ".".join(self.path) or "(root)"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def read_json(cls: type[T], raw: str | bytes) -> T:
    """The ``cls`` dataclass that the JSON document ``raw`` holds; raises
    :class:`DataclassJsonError`."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataclassJsonError(f"not a JSON document ({exc})") from None
    return read_dataclass(cls, data)


def read_dataclass(cls: type[T], data: object, *, path: tuple[str, ...] = ()) -> T:
    """The ``cls`` dataclass that the decoded JSON value ``data`` holds."""
    if not isinstance(data, dict):
        raise DataclassJsonError("must be an object", path=path)
    plan = _plan(cls)
    for key in data:
        if key not in plan.names:
            raise DataclassJsonError("unknown field (not permitted)", path=(*path, str(key)))
    values: dict[str, Any] = {}
    for field in plan.fields:
        if field.name in data:
            values[field.name] = field.read(data[field.name], (*path, field.name))
        elif field.required:
            raise DataclassJsonError("field required", path=(*path, field.name))
    try:
        return cls(**values)
    except DataclassJsonError as exc:
        raise DataclassJsonError(exc.message, path=(*path, *exc.path)) from None


def encode_json(value: object) -> bytes:
    """``value`` (a dataclass) as compact JSON bytes: enums as their values, every field."""
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False).encode()


def check_limits(value: object) -> None:
    """Check the constraints of each field of the dataclass ``value`` (not nested ones): for a
    record built in code, whose types the type checker vouches for, but whose limits only a
    run-time check sees. Raises :class:`DataclassJsonError` naming the field."""
    for field in _plan(type(value)).limited:
        field_value = getattr(value, field.name)
        if field_value is not None:
            _check(field.constraints, field_value, path=(field.name,))


def constraints_of(cls: type, name: str) -> tuple[Constraint, ...]:
    """The constraints field ``name`` of dataclass ``cls`` declares (its ``Annotated`` metadata)."""
    return next(field.constraints for field in _plan(cls).fields if field.name == name)


Reader = Callable[[object, tuple[str, ...]], Any]
"""Reads one JSON value of a field's type (at a path, for errors)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    required: bool
    read: Reader
    constraints: tuple[Constraint, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """How to read and check one dataclass, worked out once from its type hints.

    NB: per class, not per value: resolving type hints and taking ``Annotated``/union/generic
    types apart runs :mod:`typing`'s Python and touches its alias objects, and a forked worker
    copies every page it touches (issue #35: reading a spec in a fork cost 0.74 MiB of its own
    pages with the hints walked each time). The launcher works the plans out before it forks.
    """

    fields: tuple[_Field, ...]
    names: frozenset[str]
    limited: tuple[_Field, ...]
    """The fields with constraints (what :func:`check_limits` looks at)."""


_PLANS: Final[dict[type, _Plan]] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = tuple(
            _Field(
                name=field.name,
                required=field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
                read=_reader(hints[field.name], where=f"{cls.__qualname__}.{field.name}"),
                constraints=_constraints(hints[field.name]),
            )
            for field in dataclasses.fields(cls)
            if field.init
        )
        plan = _PLANS[cls] = _Plan(
            fields=fields,
            names=frozenset(field.name for field in fields),
            limited=tuple(field for field in fields if field.constraints),
        )
    return plan


def _constraints(hint: Any) -> tuple[Constraint, ...]:
    if typing.get_origin(hint) is typing.Annotated:
        return tuple(m for m in hint.__metadata__ if isinstance(m, Constraint))
    return ()


def _reader(hint: Any, *, where: str) -> Reader:
    """The reader of one field type (the module docstring lists the types supported)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _constrained(_reader(hint.__origin__, where=where), _constraints(hint))
    if hint is Any:
        return _read_any
    if origin is types.UnionType or origin is typing.Union:
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        if len(arms) != 1 or len(typing.get_args(hint)) != 2:
            raise TypeError(f"unsupported union {hint!r} at {where}")
        return _optional(_reader(arms[0], where=where))
    if origin is list:
        (item,) = typing.get_args(hint)
        return _list_of(_reader(item, where=where))
    if origin is dict:
        _, item = typing.get_args(hint)
        return _map_of(_reader(item, where=where))
    plain = _PLAIN_READERS.get(hint)
    if plain is not None:
        return plain
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _member_of(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return functools.partial(_read_nested, hint)
    raise TypeError(f"unsupported field type {hint!r} at {where}")


def _read_any(value: object, path: tuple[str, ...]) -> Any:
    return value


def _read_str(value: object, path: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise DataclassJsonError("must be a string", path=path)
    return value


def _read_bool(value: object, path: tuple[str, ...]) -> bool:
    if not isinstance(value, bool):
        raise DataclassJsonError("must be a boolean", path=path)
    return value


def _read_int(value: object, path: tuple[str, ...]) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataclassJsonError("must be an integer", path=path)
    return value


def _read_float(value: object, path: tuple[str, ...]) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise DataclassJsonError("must be a number", path=path)
    return float(value)


_PLAIN_READERS: Final[dict[Any, Reader]] = {
    str: _read_str,
    bool: _read_bool,
    int: _read_int,
    float: _read_float,
}


def _read_nested(cls: type, value: object, path: tuple[str, ...]) -> Any:
    return read_dataclass(cls, value, path=path)


def _constrained(read: Reader, constraints: tuple[Constraint, ...]) -> Reader:
    def read_constrained(value: object, path: tuple[str, ...]) -> Any:
        result = read(value, path)
        if result is not None:  # NB: ``Annotated[int | None, Ge(0)]`` constrains a given value
            _check(constraints, result, path=path)
        return result

    return read_constrained


def _optional(read: Reader) -> Reader:
    def read_optional(value: object, path: tuple[str, ...]) -> Any:
        return None if value is None else read(value, path)

    return read_optional


def _list_of(read: Reader) -> Reader:
    def read_list(value: object, path: tuple[str, ...]) -> list[Any]:
        if not isinstance(value, list):
            raise DataclassJsonError("must be a list", path=path)
        return [read(item, (*path, str(index))) for index, item in enumerate(value)]

    return read_list


def _map_of(read: Reader) -> Reader:
    def read_map(value: object, path: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise DataclassJsonError("must be an object", path=path)
        return {key: read(item, (*path, key)) for key, item in value.items()}

    return read_map


def _member_of(kind: type[enum.Enum]) -> Reader:
    known = ", ".join(repr(member.value) for member in kind)

    def read_member(value: object, path: tuple[str, ...]) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise DataclassJsonError(f"must be one of {known}", path=path) from None

    return read_member


def _check(constraints: tuple[Constraint, ...], value: Any, *, path: tuple[str, ...]) -> None:
    for constraint in constraints:
        problem = constraint.problem(value)
        if problem is not None:
            raise DataclassJsonError(problem, path=path)


def _plain(value: object) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _plain(getattr(value, field.name))
            for field in dataclasses.fields(value)
            if field.init
        }
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value

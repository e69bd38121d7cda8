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
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Final, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class MinLen:
    """A string, list or map at least this long."""

    min_length: int


@dataclasses.dataclass(frozen=True, slots=True)
class MaxLen:
    """A string, list or map at most this long."""

    max_length: int


@dataclasses.dataclass(frozen=True, slots=True)
class Gt:
    """A number greater than this."""

    gt: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ge:
    """A number greater than or equal to this."""

    ge: int


@dataclasses.dataclass(frozen=True, slots=True)
class Le:
    """A number less than or equal to this."""

    le: int


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
    fields = _fields(cls)
    unknown = [key for key in data if key not in fields]
    if unknown:
        raise DataclassJsonError("unknown field (not permitted)", path=(*path, str(unknown[0])))
    values: dict[str, Any] = {}
    for name, (hint, required) in fields.items():
        if name in data:
            values[name] = _read(hint, data[name], path=(*path, name))
        elif required:
            raise DataclassJsonError("field required", path=(*path, name))
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
    cls = type(value)
    for name in _fields(cls):
        field_value = getattr(value, name)
        if field_value is not None:
            for constraint in constraints_of(cls, name):
                _check(constraint, field_value, path=(name,))


def constraints_of(cls: type, name: str) -> tuple[Constraint, ...]:
    """The constraints field ``name`` of dataclass ``cls`` declares (its ``Annotated`` metadata)."""
    hint = _hints(cls)[name]
    if typing.get_origin(hint) is typing.Annotated:
        return tuple(m for m in hint.__metadata__ if isinstance(m, Constraint))
    return ()


_HINTS: Final[dict[type, dict[str, Any]]] = {}
_FIELDS: Final[dict[type, dict[str, tuple[Any, bool]]]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return hints


def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """Each init field of ``cls`` with its type and whether it is required."""
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = _hints(cls)
        fields = _FIELDS[cls] = {
            field.name: (
                hints[field.name],
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
            )
            for field in dataclasses.fields(cls)
            if field.init
        }
    return fields


def _read(hint: Any, value: object, *, path: tuple[str, ...]) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        result = _read(hint.__origin__, value, path=path)
        if result is None:
            return None  # NB: ``Annotated[int | None, Ge(0)]`` constrains a value when given
        for constraint in hint.__metadata__:
            _check(constraint, result, path=path)
        return result
    if hint is Any:
        return value
    if origin is types.UnionType or origin is typing.Union:
        arms = [arm for arm in typing.get_args(hint) if arm is not type(None)]
        if value is None and len(arms) < len(typing.get_args(hint)):
            return None
        if len(arms) != 1:
            raise TypeError(f"unsupported union {hint!r} at {'.'.join(path)}")
        return _read(arms[0], value, path=path)
    if origin is list:
        if not isinstance(value, list):
            raise DataclassJsonError("must be a list", path=path)
        (item,) = typing.get_args(hint)
        return [_read(item, v, path=(*path, str(i))) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise DataclassJsonError("must be an object", path=path)
        _, item = typing.get_args(hint)
        return {k: _read(item, v, path=(*path, k)) for k, v in value.items()}
    if hint is str:
        if not isinstance(value, str):
            raise DataclassJsonError("must be a string", path=path)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise DataclassJsonError("must be a boolean", path=path)
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise DataclassJsonError("must be an integer", path=path)
        return value
    if hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise DataclassJsonError("must be a number", path=path)
        return float(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            known = ", ".join(repr(member.value) for member in hint)
            raise DataclassJsonError(f"must be one of {known}", path=path) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return read_dataclass(hint, value, path=path)
    raise TypeError(f"unsupported field type {hint!r} at {'.'.join(path)}")


def _check(constraint: object, value: Any, *, path: tuple[str, ...]) -> None:
    problem: str | None = None
    if isinstance(constraint, MinLen) and len(value) < constraint.min_length:
        problem = f"must have at least {constraint.min_length} item(s) or character(s)"
    elif isinstance(constraint, MaxLen) and len(value) > constraint.max_length:
        problem = f"must have at most {constraint.max_length} item(s) or character(s)"
    elif isinstance(constraint, Gt) and not value > constraint.gt:
        problem = f"must be greater than {constraint.gt}"
    elif isinstance(constraint, Ge) and not value >= constraint.ge:
        problem = f"must be greater than or equal to {constraint.ge}"
    elif isinstance(constraint, Le) and not value <= constraint.le:
        problem = f"must be less than or equal to {constraint.le}"
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

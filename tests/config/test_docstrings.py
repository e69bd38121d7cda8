"""Field docstrings become descriptions exactly as pydantic's ``use_attribute_docstrings`` does.

:class:`lorenz.config.docstrings.DocumentedModel` replaces pydantic's per-class source reading
with one parse per module; these tests hold it to pydantic's own result, on a model with every
shape the rule distinguishes and on every settings model.
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from pydantic import Field

from lorenz.config import settings
from lorenz.config.docstrings import DocumentedModel, attribute_docstrings


class Shapes(DocumentedModel):
    plain: int = 1
    """A one-line docstring."""

    indented: str = "x"
    """First line.

        An indented second paragraph, which ``inspect.cleandoc`` dedents.
    """

    explicit: int = Field(default=0, description="Field(description=...) wins.")
    """Not this one."""

    undocumented: int = 0

    after_blank: int = 0

    """A string after a blank line still follows the assignment."""

    class Nested:
        inner: int = 0
        """Belongs to Nested, not to Shapes."""

    after_class: int = 0

    def method(self) -> None:
        local: int = 0
        """Belongs to a function body."""
        del local

    last: bool = False
    """The last field."""


class ShapesByPydantic(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(use_attribute_docstrings=True)

    plain: int = 1
    """A one-line docstring."""

    indented: str = "x"
    """First line.

        An indented second paragraph, which ``inspect.cleandoc`` dedents.
    """

    explicit: int = Field(default=0, description="Field(description=...) wins.")
    """Not this one."""

    undocumented: int = 0

    after_blank: int = 0

    """A string after a blank line still follows the assignment."""

    class Nested:
        inner: int = 0
        """Belongs to Nested, not to Shapes."""

    after_class: int = 0

    def method(self) -> None:
        local: int = 0
        """Belongs to a function body."""
        del local

    last: bool = False
    """The last field."""


def _descriptions(model: type[pydantic.BaseModel]) -> dict[str, str | None]:
    return {name: info.description for name, info in model.model_fields.items()}


def test_descriptions_match_pydantics_attribute_docstrings() -> None:
    assert _descriptions(Shapes) == _descriptions(ShapesByPydantic)
    assert Shapes.model_fields["indented"].description == (
        "First line.\n\nAn indented second paragraph, which ``inspect.cleandoc`` dedents."
    )
    assert Shapes.model_fields["undocumented"].description is None


def test_descriptions_reach_the_json_schema() -> None:
    properties = Shapes.model_json_schema()["properties"]
    by_pydantic = ShapesByPydantic.model_json_schema()["properties"]
    assert properties == by_pydantic
    assert properties["plain"]["description"] == "A one-line docstring."


def test_a_nested_class_takes_its_own_docstrings() -> None:
    assert attribute_docstrings(__name__, "Shapes.Nested") == {
        "inner": "Belongs to Nested, not to Shapes."
    }
    assert "inner" not in attribute_docstrings(__name__, "Shapes")


def test_a_class_without_readable_source_has_no_descriptions() -> None:
    namespace: dict[str, Any] = {"DocumentedModel": DocumentedModel, "__name__": "nowhere"}
    exec("class Made(DocumentedModel):\n    x: int = 0\n    'doc'\n", namespace)
    assert namespace["Made"].model_fields["x"].description is None


def test_a_built_schema_would_miss_the_docstrings_so_it_is_refused() -> None:
    with pytest.raises(TypeError, match="defer_build"):

        class Eager(DocumentedModel):
            model_config = pydantic.ConfigDict(defer_build=False)

            x: int = 0
            """Too late for the schema."""


def _settings_models() -> list[type[pydantic.BaseModel]]:
    return [
        value
        for value in vars(settings).values()
        if isinstance(value, type)
        and issubclass(value, pydantic.BaseModel)
        and value.__module__ == settings.__name__
        and value.model_fields
    ]


@pytest.mark.parametrize("model", _settings_models(), ids=lambda model: model.__name__)
def test_every_settings_model_matches_pydantics_own_reading(
    model: type[pydantic.BaseModel],
) -> None:
    # NB: pydantic's extractor is private; it is the oracle here, not something Lorenz uses.
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    by_pydantic = extract_docstrings_from_cls(model, use_inspect=True)
    assert by_pydantic, f"{model.__name__} has no field docstrings at all"
    assert attribute_docstrings(model.__module__, model.__qualname__) == by_pydantic
    for name, info in model.model_fields.items():
        assert info.description, f"{model.__name__}.{name} has no description"
        if name in by_pydantic:
            assert info.description == by_pydantic[name], name

"""docs/configuration.md is generated from the schema and must be current."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorenz.workflow import ERROR_CLASSES, KNOWN_FEATURES, KNOWN_FLAGS, docs
from lorenz.workflow.schema import iter_fields

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"


def test_committed_doc_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert docs.regenerate(text) == text, "run: python -m lorenz.workflow.docs"


def test_doc_has_every_generated_block() -> None:
    assert sorted(docs.block_names(DOC.read_text(encoding="utf-8"))) == sorted(docs.BLOCKS)


def test_doc_lists_every_key_flag_feature_and_error_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    for field in iter_fields():
        assert f"`{field.key_path}`" in text, field.key_path
    for key in KNOWN_FLAGS:
        assert f"| `{key}` |" in text
    for name in KNOWN_FEATURES:
        assert f"| `{name}` |" in text
    for cls in ERROR_CLASSES:
        assert f"| `{cls.code}` |" in text


def test_doc_documents_precedence_var_rules_and_exit_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "command line > front matter > environment > default" in text
    assert "`$NAME` counts only as the **whole value**" in text
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 130 |"):
        assert code in text


def test_check_mode_fails_on_a_stale_doc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("intro\n<!-- generated:flags -->\nold table\n<!-- /generated:flags -->\n")
    assert docs.main([str(stale), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert docs.main([str(stale)]) == 0
    assert "old table" not in stale.read_text()
    assert "`claim_store.backend`" in stale.read_text()
    assert docs.main([str(stale), "--check"]) == 0


def test_unknown_block_names_are_refused() -> None:
    with pytest.raises(KeyError, match="unknown generated block"):
        docs.regenerate("<!-- generated:nope -->\n<!-- /generated:nope -->")

"""docs/configuration.md is generated from the config classes and must be up to date."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

from raven.config.agent import AgentConfig
from raven.config.gateway import GatewayConfig
from raven.config.loader import describe
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def generator() -> ModuleType:
    return load_script(ROOT / "scripts/gen_config_docs.py")


def test_configuration_reference_is_up_to_date() -> None:
    expected = generator().render()
    assert DOC.read_text(encoding="utf-8") == expected, (
        "docs/configuration.md is out of date: run python scripts/gen_config_docs.py"
    )


def test_every_field_is_documented_and_listed() -> None:
    text = DOC.read_text(encoding="utf-8")
    for cls in (GatewayConfig, AgentConfig):
        rows = describe(cls)
        assert rows
        for path, _tp, _default, doc in rows:
            assert doc, f"{cls.__name__}.{path} has no doc string"
            assert f"| `{path}` |" in text, path


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    gen = generator()
    stale = tmp_path / "configuration.md"
    stale.write_text(gen.render().replace("Where agents connect.", "Stale text."))
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0


def test_generated_rows_follow_the_dataclass_fields() -> None:
    top = [r[0] for r in describe(GatewayConfig) if "." not in r[0] and "[]" not in r[0]]
    assert top == [f.name for f in dataclasses.fields(GatewayConfig)]

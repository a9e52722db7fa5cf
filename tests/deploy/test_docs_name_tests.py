"""Claims are tests: every test a document names (``tests/...py::test_name``) exists, so a
promise in docs/ (docs/security.md names one per promise) cannot outlive the test behind it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:::(\w+))?")


def _defined(path: Path) -> set[str]:
    """Test functions of a module, and Class::method pairs."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return names


def test_every_test_a_document_names_exists() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing, seen = [], 0
    for doc in docs:
        for match in _REF.finditer(doc.read_text()):
            seen += 1
            module, name = REPO / match.group(1), match.group(2)
            if match.group(3):
                name = f"{name}::{match.group(3)}"
            if not module.is_file() or name not in _defined(module):
                missing.append(f"{doc.relative_to(REPO)}: {match.group(0)}")
    assert seen > 0
    assert not missing, "documents name tests that do not exist:\n" + "\n".join(missing)


def test_every_section_of_the_threat_model_names_its_tests() -> None:
    text = (REPO / "docs" / "security.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    bare = [s.splitlines()[0] for s in sections if not _REF.search(s)]
    assert bare == ["What the agent does not promise"], bare

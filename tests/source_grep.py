"""The package's source lines that match a pattern: how the one-home tests find a concept written twice."""

import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "specrank"


def source_lines_matching(pattern: re.Pattern, home: str) -> list[str]:
    """``file:line: text`` of every line of ``src/specrank`` outside ``home`` (its path there) matching ``pattern``."""
    return [f"{path.relative_to(SRC)}:{i}: {line.strip()}"
            for path in sorted(SRC.rglob("*.py")) if path.relative_to(SRC).as_posix() != home
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]

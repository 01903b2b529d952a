"""Markdown tables: the report's, and run descriptions in MLflow."""


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table (the report's, and run descriptions in MLflow)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def interval_cell(x, digits: int = 2, sign: bool = True) -> str:
    """``point [low, high]`` of an interval given as [point, low, high] (``sign``: with a leading + or -)."""
    point, low, high = x
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(point)} [{f.format(low)}, {f.format(high)}]"

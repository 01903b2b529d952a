"""The engine plugins' settings, read from the environment variables a server is started with."""

from __future__ import annotations


def number_setting(env, name: str, kind: type, default, low):
    """``env[name]`` as ``kind`` (int or float) >= ``low``, ``default`` when unset or blank; a malformed value raises
    a one-line ``ValueError`` naming the variable."""
    text = env.get(name, "").strip()
    try:
        value = kind(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a {kind.__name__} >= {low:g}") from None
    if value < low:
        raise ValueError(f"{name}={text!r}: expected a {kind.__name__} >= {low:g}")
    return value

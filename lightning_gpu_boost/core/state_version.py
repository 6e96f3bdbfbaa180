"""Saved states carry a version: a state written by a newer package is refused naming both versions, never read
wrongly. States written before versions existed (no ``version`` key) read as version 0."""

from __future__ import annotations

from typing import Any

__all__ = ["check_state_version"]


def check_state_version(owner: str, state: Any, known: int) -> int:
    """The version of ``state`` (``owner``'s ``state_dict``); raises ``ValueError`` naming ``owner`` and both
    versions where it is newer than ``known`` (or not a version at all)."""
    version = state.get("version", 0) if isinstance(state, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= known:
        raise ValueError(
            f"{owner}: the checkpoint holds its state in version {version!r}; this lightning-gpu-boost reads versions "
            f"up to {known}. Resume with the version that saved it, or a newer one."
        )
    return version

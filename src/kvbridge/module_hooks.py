"""Torch module hooks registered together and removed together (steering, masking, counting)."""

from __future__ import annotations


class HookSet:
    """Subclasses fill ``self.handles`` with the handles ``register_forward_*hook`` returned. Removing is
    idempotent; used as a context manager, the hooks are removed on exit, however it exits."""

    handles: list

    def remove(self) -> None:
        for h in getattr(self, "handles", ()):
            h.remove()
        self.handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

"""The on-disk cache of evaluated groups, keyed by content digests of every input (model, hardware, profile,
view tables), sealed with checksums so a damaged or stale entry is recomputed, never read."""
from __future__ import annotations

import json
from pathlib import Path


from ...driver.views import view_name


def _view_digests(view) -> dict:
    """The content of the files a measured or FPM view reads (the view itself names only their paths): an
    edited table or model file changes every cached program's identity."""
    from ...driver.identity import fpm_digest
    from ...views.measured.schema import measured_digest

    if view_name(view) == "sol" or view.measured is None:
        return {}
    src = getattr(view.measured, "root", view.measured)  # a folder, a file or an open Store
    if view.name == "fpm":
        return {"fpm": fpm_digest(src)}
    return {"measured": measured_digest(src)}


class _Cache:
    """Evaluated groups on disk (``<dir>/<key>.json``), so an interrupted search resumes."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, identity: str):
        """The entry ``key`` when its checksum holds and it was computed from ``identity``; a damaged,
        edited or foreign entry is removed (recomputed), never trusted."""
        if self.folder is None:
            return None
        from ...driver.identity import discard, verify

        p = self.folder / f"{key}.json"
        if not p.is_file():
            return None
        if verify(p, {"search": identity}) is not None:
            discard(p)
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None  # a torn file: recompute

    def put(self, key: str, d: dict, identity: str) -> None:
        if self.folder is None:
            return
        from ...driver.identity import seal
        from ...core.outputs import write_text

        p = self.folder / f"{key}.json"
        write_text(p, json.dumps(d))
        seal(p, {"search": identity})

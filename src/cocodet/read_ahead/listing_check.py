"""Whether an object's fetched bytes are the listing's: its size, always; its MD5 where the
store's ETags are MD5s. A copy that fails the check is never published.
"""

from __future__ import annotations

import hashlib
import logging
import re

from cocodet.storage import store as storage
from cocodet.storage.errors import StoreError

log = logging.getLogger(__name__)


class ListingCheck:
    """Checks against ``objects`` (URL -> ``{"size", "etag"}``, one listing)."""

    def __init__(self, objects: dict[str, dict]):
        self.objects = objects
        self._etags_are_md5 = True  # until an object shows otherwise (SSE-KMS, SSE-C): then sizes only

    def check(self, url: str, data: bytes) -> None:
        """The listing's size, always; the MD5 where the ETag is one. A single-part upload's
        ETag is the MD5 of its bytes, except under SSE-KMS or SSE-C, whose ETags look the same
        (32 hex digits) but are not. So an MD5 that differs is settled by one HEAD: the same
        ETag as listed means the object did not change and this store's ETags are not MD5s
        (sizes only from then on, in this process); another ETag means it changed."""
        want = self.objects[url]
        etag = want["etag"]
        changed = len(data) != want["size"]
        if (
            not changed
            and self._etags_are_md5
            and re.fullmatch(r"[0-9a-f]{32}", etag)
            and hashlib.md5(data, usedforsecurity=False).hexdigest() != etag
        ):
            changed = storage.object_info(url)["etag"] != etag
            if not changed:
                self._etags_are_md5 = False
                log.info(
                    "%s: its ETag is not the MD5 of its bytes (SSE-KMS or SSE-C): copies from this store are "
                    "checked by their size",
                    url,
                )
        if changed:
            raise StoreError(
                f"{url}: read {len(data)} bytes that do not match the listing ({want['size']} "
                f"bytes, ETag {etag}); the object changed during the run: start it again"
            )

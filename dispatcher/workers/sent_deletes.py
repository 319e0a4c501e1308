"""The deletions of copies this process sent to one worker, kept with the worker."""

from __future__ import annotations

import threading
from collections import OrderedDict


class SentDeletes:
    """The copies (by UID) deleted on one worker by this process, the latest ``size``: a
    reconcile that runs before the watch has delivered a deletion does not send it again."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._uids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, uid: str) -> None:
        with self._lock:
            self._uids[uid] = None
            while len(self._uids) > self.size:
                self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        with self._lock:
            return uid in self._uids

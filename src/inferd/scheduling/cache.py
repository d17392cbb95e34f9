"""The response cache: identical requests to a model version get the stored response.

One cache for the server (``--cache-size`` bytes), least recently used out first, keyed on
model, version, every input's name, datatype, shape and bytes, and the requested outputs.
Used on the event loop and on the threads of in-process callers (``inferd.app.direct``): a
lock keeps its order and its size in step.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from inferd.core.types import Tensors


def _update(digest: hashlib.blake2b, array: np.ndarray) -> None:
    if array.dtype == object:
        for item in array.ravel().tolist():
            data = item if isinstance(item, bytes) else str(item).encode()
            digest.update(len(data).to_bytes(4, "little"))
            digest.update(data)
    else:
        flat: object = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        digest.update(memoryview(flat))  # type: ignore[arg-type]


def _nbytes(outputs: Tensors) -> int:
    total = 0
    for array in outputs.values():
        if array.dtype == object:
            total += sum(len(b) for b in array.ravel().tolist()) + 8 * array.size
        else:
            total += array.nbytes
    return total


class ResponseCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[bytes, tuple[Tensors, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def key(model: str, version: int, inputs: Tensors, outputs: Sequence[str]) -> bytes:
        digest = hashlib.blake2b(digest_size=32)
        digest.update(f"{model}\0{version}\0{','.join(outputs)}\0".encode())
        for name in sorted(inputs):
            array = inputs[name]
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            _update(digest, array)
        return digest.digest()

    def get(self, key: bytes) -> Tensors | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: bytes, outputs: Tensors) -> None:
        owned = {name: np.array(array, copy=True) for name, array in outputs.items()}
        for array in owned.values():
            array.flags.writeable = False
        size = _nbytes(owned) + len(key)
        if size > self.capacity_bytes:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.used_bytes -= previous[1]
            while self._entries and self.used_bytes + size > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.used_bytes -= evicted
            self._entries[key] = (owned, size)
            self.used_bytes += size

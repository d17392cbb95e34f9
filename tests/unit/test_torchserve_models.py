"""TorchServe's request ids: random UUIDs, as TorchServe names its requests."""

from __future__ import annotations

import uuid

from inferd.torchserve.models import new_request_id


def test_request_ids_are_random_uuids() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # the canonical form: lower-case hex, 8-4-4-4-12
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
    # every bit that is not the version's or the variant's varies
    ones = 0
    zeros = 0
    for text in ids:
        value = uuid.UUID(text).int
        ones |= value
        zeros |= ~value
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert ones | fixed == (1 << 128) - 1
    assert zeros & ((1 << 128) - 1) | fixed == (1 << 128) - 1

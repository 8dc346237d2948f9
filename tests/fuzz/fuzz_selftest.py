"""A target that breaks each rule the harness enforces, to show that the rule holds: LLAMACTX_FUZZ_SELFTEST says
which (raise: an undocumented exception, hang: 2 s on one input, alloc: 2 GiB at once)."""

from __future__ import annotations

import os
import time

from tests.fuzz.harness import main

MODE = os.environ.get("LLAMACTX_FUZZ_SELFTEST", "raise")


def test_one_input(data: bytes) -> None:
    if data != b"go":
        return
    if MODE == "raise":
        raise KeyError("not a documented error")
    if MODE == "hang":
        time.sleep(2)
    if MODE == "alloc":
        bytearray(2 << 30)


if __name__ == "__main__":
    main(test_one_input, {"go": b"go"})

"""One clock for every time in the histories, faked clocks or not.

Every time in the histories is a reading of ``CLOCK_BOOTTIME`` taken with a raw system
call (:func:`machine_clock`): one clock for the whole machine, which libfaketime cannot
fake (it replaces the C library's ``clock_gettime``, not the kernel's), so a contender
under faketime stamps its history on the same clock as everyone else.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import time
from collections.abc import Callable

_CLOCK_BOOTTIME = 7
_SYS_CLOCK_GETTIME = {"x86_64": 228, "amd64": 228, "aarch64": 113, "arm64": 113}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _raw_boottime_reader() -> Callable[[], float] | None:
    """CLOCK_BOOTTIME straight from the kernel, past any LD_PRELOADed clock faker."""
    number = _SYS_CLOCK_GETTIME.get(platform.machine().lower())
    if number is None or not sys.platform.startswith("linux"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long

    def read() -> float:
        ts = _Timespec()
        if syscall(ctypes.c_long(number), ctypes.c_long(_CLOCK_BOOTTIME), ctypes.byref(ts)) != 0:
            raise OSError(ctypes.get_errno(), "clock_gettime(CLOCK_BOOTTIME) failed")
        return float(ts.tv_sec) + float(ts.tv_nsec) / 1e9

    try:
        read()
    except OSError:
        return None
    return read


_read_boottime = _raw_boottime_reader()


def machine_clock() -> float:
    """Seconds on one clock shared by every process of the machine, faked or not."""
    if _read_boottime is not None:
        return _read_boottime()
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def monotonic_to_machine(reading: float) -> float:
    """Convert a ``time.monotonic()`` reading of this process to :func:`machine_clock`.

    Under faketime the two differ by a constant offset (the rates are the same), which
    is read afresh on every call.
    """
    return reading + (machine_clock() - time.monotonic())


def boot_to_machine(reading: float) -> float:
    """Convert a reading of the lock's validity clock (:func:`coordinator.rules.lease.boot_clock`)
    of this process to :func:`machine_clock` (under faketime they differ by an offset)."""
    from coordinator.rules.lease import boot_clock

    return reading + (machine_clock() - boot_clock())

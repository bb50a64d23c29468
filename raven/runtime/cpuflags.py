"""What this CPU offers the tunnel's ciphers, from ``/proc/cpuinfo`` (Linux): read by the
config layer, never by the sans-IO core."""

from __future__ import annotations

from pathlib import Path

#: Lines of /proc/cpuinfo listing the CPU's features: x86 (``flags``), arm64 (``Features``).
_FEATURE_KEYS = ("flags", "features")


def cpu_has_aes(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """True when the CPU has AES instructions (x86 AES-NI, the ARMv8 crypto extension):
    the ``aes`` feature flag. False when the file cannot be read (not Linux)."""
    try:
        text = Path(cpuinfo).read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in _FEATURE_KEYS:
            return "aes" in value.split()
    return False

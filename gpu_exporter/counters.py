"""The counter table: which DCGM fields the exporter knows, and the counters-file parser.

A counters file uses dcgm-exporter's format, one counter a line::

    # comment
    DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).

The first column names a DCGM field, the second its Prometheus type (``gauge``, ``counter``,
or ``label``: the value becomes a label on every other series, as dcgm-exporter does for
``DCGM_FI_DRIVER_VERSION``), the rest of the line is the help text (it may hold commas).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = [
    "CUSTOM_METRICS",
    "FIELDS",
    "MAX_COUNTERS_FILE_BYTES",
    "Counter",
    "CountersFileError",
    "CustomMetric",
    "FieldSpec",
    "MetricType",
    "ValueKind",
    "default_counters",
    "load_counters_file",
    "parse_counters",
]

MAX_COUNTERS_FILE_BYTES = 1 << 20
"""A counters file larger than this is refused (bytes)."""


class MetricType(enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    LABEL = "label"


class ValueKind(enum.Enum):
    """How a value is written: integers as integers, doubles with six decimals (like DCGM)."""

    INT = "int"
    FLOAT = "float"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """A DCGM field this exporter can collect."""

    name: str
    kind: ValueKind
    unit: str
    source: str
    """Where the value comes from (NVML call), for the docs."""
    profiling: bool = False
    """True for DCGM_FI_PROF_* fields: only where NVML GPM works (Hopper and newer)."""


@dataclass(frozen=True, slots=True)
class Counter:
    """One line of a counters file."""

    field: str
    type: MetricType
    help: str


@dataclass(frozen=True, slots=True)
class CustomMetric:
    """An ACK-style per-process or per-container metric."""

    name: str
    help: str
    unit: str


class CountersFileError(ValueError):
    """A counters file line that cannot be used; names the file, the line and the reason."""

    def __init__(self, source: str, line_no: int, reason: str) -> None:
        super().__init__(f"{source}:{line_no}: {reason}")
        self.source = source
        self.line_no = line_no
        self.reason = reason


_I, _F = ValueKind.INT, ValueKind.FLOAT

FIELDS: dict[str, FieldSpec] = {
    f.name: f
    for f in (
        FieldSpec("DCGM_FI_DEV_SM_CLOCK", _I, "MHz", "nvmlDeviceGetClockInfo(SM)"),
        FieldSpec("DCGM_FI_DEV_MEM_CLOCK", _I, "MHz", "nvmlDeviceGetClockInfo(MEM)"),
        FieldSpec("DCGM_FI_DEV_MEMORY_TEMP", _I, "C", "nvmlDeviceGetFieldValues(MEMORY_TEMP)"),
        FieldSpec("DCGM_FI_DEV_GPU_TEMP", _I, "C", "nvmlDeviceGetTemperature(GPU)"),
        FieldSpec("DCGM_FI_DEV_POWER_USAGE", _F, "W", "nvmlDeviceGetPowerUsage (mW / 1000)"),
        FieldSpec(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            _I,
            "mJ",
            "nvmlDeviceGetTotalEnergyConsumption",
        ),
        FieldSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", _I, "1", "nvmlDeviceGetPcieReplayCounter"),
        FieldSpec("DCGM_FI_DEV_GPU_UTIL", _I, "%", "nvmlDeviceGetUtilizationRates.gpu"),
        FieldSpec("DCGM_FI_DEV_MEM_COPY_UTIL", _I, "%", "nvmlDeviceGetUtilizationRates.memory"),
        FieldSpec("DCGM_FI_DEV_ENC_UTIL", _I, "%", "nvmlDeviceGetEncoderUtilization"),
        FieldSpec("DCGM_FI_DEV_DEC_UTIL", _I, "%", "nvmlDeviceGetDecoderUtilization"),
        FieldSpec("DCGM_FI_DEV_XID_ERRORS", _I, "1", "NVML XID critical-error events"),
        FieldSpec("DCGM_FI_DEV_FB_FREE", _I, "MiB", "nvmlDeviceGetMemoryInfo.free (B / 2^20)"),
        FieldSpec("DCGM_FI_DEV_FB_USED", _I, "MiB", "nvmlDeviceGetMemoryInfo.used (B / 2^20)"),
        FieldSpec(
            "DCGM_FI_DEV_FB_RESERVED", _I, "MiB", "nvmlDeviceGetMemoryInfo_v2.reserved (B / 2^20)"
        ),
        FieldSpec(
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            _I,
            "KiB",
            "nvmlDeviceGetFieldValues(NVLINK_THROUGHPUT_RAW_TX + RAW_RX)",
        ),
        FieldSpec(
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS", _I, "1", "nvmlDeviceGetGridLicensableFeatures"
        ),
        FieldSpec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", _I, "1", "nvmlDeviceGetRemappedRows"),
        FieldSpec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", _I, "1", "nvmlDeviceGetRemappedRows"),
        FieldSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", _I, "1", "nvmlDeviceGetRemappedRows"),
        FieldSpec("DCGM_FI_DRIVER_VERSION", _I, "", "nvmlSystemGetDriverVersion (label)"),
        FieldSpec(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE", _F, "ratio", "GPM GRAPHICS_UTIL / 100", profiling=True
        ),
        FieldSpec(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            _F,
            "ratio",
            "GPM ANY_TENSOR_UTIL / 100",
            profiling=True,
        ),
        FieldSpec(
            "DCGM_FI_PROF_DRAM_ACTIVE", _F, "ratio", "GPM DRAM_BW_UTIL / 100", profiling=True
        ),
        FieldSpec(
            "DCGM_FI_PROF_PCIE_TX_BYTES", _I, "B/s", "GPM PCIE_TX_PER_SEC (MiB/s)", profiling=True
        ),
        FieldSpec(
            "DCGM_FI_PROF_PCIE_RX_BYTES", _I, "B/s", "GPM PCIE_RX_PER_SEC (MiB/s)", profiling=True
        ),
    )
}

CUSTOM_METRICS: tuple[CustomMetric, ...] = (
    CustomMetric("DCGM_CUSTOM_PROCESS_SM_UTIL", "SM utilization of a GPU process (in %).", "%"),
    CustomMetric(
        "DCGM_CUSTOM_PROCESS_MEM_COPY_UTIL",
        "Memory copy utilization of a GPU process (in %).",
        "%",
    ),
    CustomMetric(
        "DCGM_CUSTOM_PROCESS_ENCODE_UTIL", "Encoder utilization of a GPU process (in %).", "%"
    ),
    CustomMetric(
        "DCGM_CUSTOM_PROCESS_DECODE_UTIL", "Decoder utilization of a GPU process (in %).", "%"
    ),
    CustomMetric(
        "DCGM_CUSTOM_PROCESS_MEM_USED", "Framebuffer memory used by a GPU process (in MiB).", "MiB"
    ),
    CustomMetric(
        "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED",
        "Framebuffer memory allocated to a container: total memory of its GPUs (in MiB).",
        "MiB",
    ),
)


def parse_counters(text: str, source: str = "<counters>") -> list[Counter]:
    """Parse a counters file; raise CountersFileError naming the first bad line."""
    counters: list[Counter] = []
    seen: set[str] = set()
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",", 2)
        if len(parts) < 3:
            raise CountersFileError(
                source,
                line_no,
                f"expected 'DCGM FIELD, type, help message', got {_excerpt(line)!r}",
            )
        name, type_text, help_text = (p.strip() for p in parts)
        if name not in FIELDS:
            raise CountersFileError(source, line_no, f"unknown or unsupported field {name!r}")
        try:
            metric_type = MetricType(type_text.lower())
        except ValueError:
            raise CountersFileError(
                source,
                line_no,
                f"unknown metric type {type_text!r} for {name} (use gauge, counter or label)",
            ) from None
        if not help_text:
            raise CountersFileError(source, line_no, f"empty help message for {name}")
        if name in seen:
            raise CountersFileError(source, line_no, f"field {name} listed twice")
        seen.add(name)
        counters.append(Counter(name, metric_type, help_text))
    if not counters:
        raise CountersFileError(source, 0, "no counters defined")
    return counters


def load_counters_file(path: str | Path) -> list[Counter]:
    """Read and parse a counters file from disk (bounded size, UTF-8)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_COUNTERS_FILE_BYTES + 1)
    except OSError as exc:
        raise CountersFileError(str(p), 0, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_COUNTERS_FILE_BYTES:
        raise CountersFileError(str(p), 0, f"file larger than {MAX_COUNTERS_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CountersFileError(str(p), 0, f"not UTF-8 text ({exc.reason})") from exc
    return parse_counters(text, str(p))


def default_counters() -> list[Counter]:
    """The counters shipped in default-counters.csv."""
    text = resources.files(__package__).joinpath("default-counters.csv").read_text("utf-8")
    return parse_counters(text, "default-counters.csv")


def _excerpt(line: str, limit: int = 60) -> str:
    return line if len(line) <= limit else line[:limit] + "..."

"""The counter table: which DCGM fields the exporter knows, and the counters-file parser.

A counters file uses dcgm-exporter's format, one counter a line::

    # comment
    DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).

The first column names a DCGM field (or its dcgm-exporter 1.x name, ``dcgm_sm_clock``: the
series then keep that name), the second its Prometheus type (``gauge``, ``counter``, or
``label``: the value becomes a label on every other series, as dcgm-exporter does for
``DCGM_FI_DRIVER_VERSION``), the rest of the line is the help text (it may hold commas).

As dcgm-exporter, a field this exporter cannot serve is skipped with one warning
(``Skipping line N ('FIELD'): ...``) and the rest of the file is used; a line that is not
``field, type, help`` or names an unknown type stops the load with the line's number.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = [
    "CUSTOM_METRICS",
    "FIELDS",
    "LEGACY_NAMES",
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

log = logging.getLogger(__name__)

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
    """True for DCGM_FI_PROF_* fields: DCGM on Volta and newer, NVML GPM on Hopper and newer."""


@dataclass(frozen=True, slots=True)
class Counter:
    """One line of a counters file."""

    field: str
    type: MetricType
    help: str
    name: str = ""
    """The metric name when it differs from the field (a 1.x name such as dcgm_sm_clock)."""

    @property
    def metric(self) -> str:
        return self.name or self.field


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
        FieldSpec("DCGM_FI_DEV_FB_TOTAL", _I, "MiB", "nvmlDeviceGetMemoryInfo.total (B / 2^20)"),
        FieldSpec("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", _I, "KB/s", "nvmlDeviceGetPcieThroughput(TX)"),
        FieldSpec("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", _I, "KB/s", "nvmlDeviceGetPcieThroughput(RX)"),
        *(
            FieldSpec(f"DCGM_FI_DEV_{v}_VIOLATION", _I, "ns", f"nvmlDeviceGetViolationStatus({v})")
            for v in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY")
        ),
        *(
            FieldSpec(f"DCGM_FI_DEV_ECC_{e}_{c}_TOTAL", _I, "1", "nvmlDeviceGetTotalEccErrors")
            for e in ("SBE", "DBE")
            for c in ("VOL", "AGG")
        ),
        FieldSpec("DCGM_FI_DEV_RETIRED_SBE", _I, "1", "nvmlDeviceGetRetiredPages(SBE)"),
        FieldSpec("DCGM_FI_DEV_RETIRED_DBE", _I, "1", "nvmlDeviceGetRetiredPages(DBE)"),
        FieldSpec("DCGM_FI_DEV_RETIRED_PENDING", _I, "1", "nvmlDeviceGetRetiredPagesPendingStatus"),
        FieldSpec("DCGM_FI_DRIVER_VERSION", _I, "", "nvmlSystemGetDriverVersion (label)"),
        FieldSpec("DCGM_FI_PROF_SM_ACTIVE", _F, "ratio", "GPM SM_UTIL / 100", profiling=True),
        FieldSpec(
            "DCGM_FI_PROF_SM_OCCUPANCY", _F, "ratio", "GPM SM_OCCUPANCY / 100", profiling=True
        ),
        *(
            FieldSpec(
                f"DCGM_FI_PROF_PIPE_{p}_ACTIVE", _F, "ratio", f"GPM {p}_UTIL / 100", profiling=True
            )
            for p in ("FP64", "FP32", "FP16")
        ),
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


_LEGACY_PREFIXED = ("dcgm_fi_prof_",)
LEGACY_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_tx_throughput": "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "dcgm_pcie_rx_throughput": "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL",
    "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL",
    "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS",
    "dcgm_power_violation": "DCGM_FI_DEV_POWER_VIOLATION",
    "dcgm_thermal_violation": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "dcgm_sync_boost_violation": "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "dcgm_board_limit_violation": "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "dcgm_low_util_violation": "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "dcgm_reliability_violation": "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE",
    "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
}
"""dcgm-exporter 1.x metric names -> DCGM fields (``dcgm_fi_prof_*`` map by upper-casing)."""


def _resolve(name: str) -> tuple[str, str]:
    """(DCGM field, metric name if it differs) for a counters-file name."""
    if name in LEGACY_NAMES:
        return LEGACY_NAMES[name], name
    if name.startswith(_LEGACY_PREFIXED):
        return name.upper(), name
    return name, ""


def _skip_reason(field: str) -> str:
    if field.startswith(("DCGM_FI_", "DCGM_EXP_")):
        return "field not served by this exporter"
    return "unknown field"


def parse_counters(text: str, source: str = "<counters>") -> list[Counter]:
    """Parse a counters file; raise CountersFileError naming the first malformed line.

    A field this exporter cannot serve is skipped with one warning, as dcgm-exporter does.
    """
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
        field, metric = _resolve(name)
        if field not in FIELDS:
            log.warning(
                "Skipping line %d ('%s'): %s source=%s",
                line_no,
                _excerpt(name),
                _skip_reason(field),
                source,
            )
            continue
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
            log.warning("Skipping line %d ('%s'): listed before source=%s", line_no, name, source)
            continue
        seen.add(name)
        counters.append(Counter(field, metric_type, help_text, metric))
    if not counters:
        raise CountersFileError(source, 0, "no counters this exporter can serve")
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

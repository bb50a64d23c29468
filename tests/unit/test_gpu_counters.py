"""The counter table and the counters-file parser."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpu_exporter.counters import (
    FIELDS,
    MAX_COUNTERS_FILE_BYTES,
    CountersFileError,
    MetricType,
    default_counters,
    load_counters_file,
    parse_counters,
)

# dcgm-exporter's names, types and help texts for the default counters.
EXPECTED = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DRIVER_VERSION": ("label", "Driver Version"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
}


def test_default_counters_match_dcgm_exporter() -> None:
    got = {c.field: (c.type.value, c.help) for c in default_counters()}
    assert got == EXPECTED


def test_every_field_has_a_spec() -> None:
    assert set(EXPECTED) <= set(FIELDS)
    assert {f for f, s in FIELDS.items() if s.profiling} == {
        k for k in FIELDS if k.startswith("DCGM_FI_PROF_")
    }


UPSTREAM = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "upstream"
# Fields of upstream's files this exporter does not serve: skipped with one warning each.
NOT_SERVED = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_VBIOS_VERSION",
}


def every_line_enabled(text: str) -> str:
    """Upstream's file with its commented-out counters enabled (not its prose comments)."""
    out = []
    for line in text.splitlines():
        body = line.lstrip("# ")
        out.append(body if line.startswith("# ") and body.lower().startswith("dcgm_") else line)
    return "\n".join(out)


@pytest.mark.parametrize(
    "name", ["default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv"]
)
@pytest.mark.parametrize("enable_all", [False, True])
def test_upstream_counters_files_load(
    name: str, enable_all: bool, caplog: pytest.LogCaptureFixture
) -> None:
    text = (UPSTREAM / name).read_text()
    if enable_all:
        text = every_line_enabled(text)
    wanted = [
        line.split(",", 1)[0].strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.counters"):
        counters = parse_counters(text, name)
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == len(wanted) - len(counters)  # one warning per skipped line
    assert all(m.startswith("Skipping line ") for m in skipped)
    for msg in skipped:
        field = msg.split("('", 1)[1].split("')", 1)[0]
        listed_before = msg.endswith(f"listed before source={name}")
        assert field.upper() in NOT_SERVED or "nvlink_" in field or listed_before, msg
    served = {c.metric for c in counters}
    assert [c.metric for c in counters] == list(dict.fromkeys(w for w in wanted if w in served))
    if name.startswith("1.x"):
        # 1.x names stay the metric names; the field behind them is the DCGM one
        (sm,) = [c for c in counters if c.metric == "dcgm_sm_clock"]
        assert sm.field == "DCGM_FI_DEV_SM_CLOCK"
        (prof,) = [c for c in counters if c.metric == "dcgm_fi_prof_gr_engine_active"]
        assert prof.field == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def test_help_may_contain_commas_and_spaces_are_trimmed() -> None:
    (c,) = parse_counters("  DCGM_FI_DEV_GPU_TEMP ,  Gauge , temp, in C, really  \n")
    assert (c.field, c.type, c.help) == (
        "DCGM_FI_DEV_GPU_TEMP",
        MetricType.GAUGE,
        "temp, in C, really",
    )


def test_comments_and_blank_lines_are_skipped() -> None:
    text = "# Format,,\n\n   \n# DCGM_FI_DEV_SM_CLOCK, gauge, x\nDCGM_FI_DEV_GPU_UTIL, gauge, u\n"
    assert [c.field for c in parse_counters(text)] == ["DCGM_FI_DEV_GPU_UTIL"]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("DCGM_FI_DEV_GPU_TEMP gauge temp\n", 1, "expected 'DCGM FIELD, type, help message'"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge\n", 1, "expected 'DCGM FIELD, type, help message'"),
        ("DCGM_FI_DEV_GPU_TEMP, histogram, x\n", 1, "unknown metric type 'histogram'"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge,   \n", 1, "empty help message"),
        ("# nothing\n", 0, "no counters this exporter can serve"),
        ("DCGM_FI_DEV_NOPE, gauge, x\n", 0, "no counters this exporter can serve"),
    ],
)
def test_bad_lines_give_clear_errors(text: str, line: int, reason: str) -> None:
    with pytest.raises(CountersFileError) as info:
        parse_counters(text, "my.csv")
    assert info.value.line_no == line
    assert reason in info.value.reason
    assert str(info.value).startswith(f"my.csv:{line}: ")


def test_unknown_fields_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    text = "DCGM_FI_DEV_NOPE, gauge, x\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nbogus, gauge, y\n"
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.counters"):
        assert [c.field for c in parse_counters(text, "my.csv")] == ["DCGM_FI_DEV_GPU_TEMP"]
    assert [r.getMessage() for r in caplog.records] == [
        "Skipping line 1 ('DCGM_FI_DEV_NOPE'): field not served by this exporter source=my.csv",
        "Skipping line 3 ('bogus'): unknown field source=my.csv",
    ]


def test_load_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CountersFileError, match="cannot read"):
        load_counters_file(tmp_path / "missing.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CountersFileError, match="not UTF-8"):
        load_counters_file(binary)
    big = tmp_path / "big.csv"
    big.write_bytes(b"#" * (MAX_COUNTERS_FILE_BYTES + 1))
    with pytest.raises(CountersFileError, match="larger than"):
        load_counters_file(big)
    good = tmp_path / "good.csv"
    good.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    assert [c.field for c in load_counters_file(good)] == ["DCGM_FI_DEV_GPU_TEMP"]

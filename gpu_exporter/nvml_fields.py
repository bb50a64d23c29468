"""What the NVML backend reads for each DCGM field: NVML constants, scales and value decoding."""

from __future__ import annotations

from types import ModuleType
from typing import Any

__all__ = [
    "ECC",
    "GPM_FIELDS",
    "MEMORY_FIELDS",
    "MIB",
    "RETIRED",
    "VIOLATIONS",
    "attr",
    "field_value",
    "length",
    "milli",
]

MIB = 1 << 20
GPM_FIELDS = {
    # DCGM field: (GPM metric constant, scale from the GPM unit to the DCGM unit)
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(MIB)),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(MIB)),
    "DCGM_FI_PROF_SM_ACTIVE": ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("NVML_GPM_METRIC_FP64_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("NVML_GPM_METRIC_FP32_UTIL", 0.01),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("NVML_GPM_METRIC_FP16_UTIL", 0.01),
}
VIOLATIONS = {
    # DCGM field: NVML perf-policy constant (violation time in ns)
    "DCGM_FI_DEV_POWER_VIOLATION": "NVML_PERF_POLICY_POWER",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "NVML_PERF_POLICY_THERMAL",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": "NVML_PERF_POLICY_SYNC_BOOST",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": "NVML_PERF_POLICY_BOARD_LIMIT",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": "NVML_PERF_POLICY_LOW_UTILIZATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": "NVML_PERF_POLICY_RELIABILITY",
}
ECC = {
    # DCGM field: (NVML error type, NVML counter type)
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
}
RETIRED = {
    "DCGM_FI_DEV_RETIRED_SBE": "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
    "DCGM_FI_DEV_RETIRED_DBE": "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
}
MEMORY_FIELDS = (
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_FB_TOTAL",
)


def attr(value: Any, name: str) -> Any:
    return None if value is None else getattr(value, name)


def length(value: Any) -> int | None:
    return None if value is None else len(value)


def milli(value: Any) -> float | None:
    """mW -> W (NVML reports power in milliwatts)."""
    return None if value is None else int(value) / 1000.0


def field_value(n: ModuleType, fv: Any) -> float:
    kind = fv.valueType
    if kind == n.NVML_VALUE_TYPE_DOUBLE:
        return float(fv.value.dVal)
    if kind == n.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(fv.value.uiVal)
    if kind == n.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(fv.value.ulVal)
    if kind == n.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(fv.value.sllVal)
    if kind == n.NVML_VALUE_TYPE_SIGNED_INT:
        return float(fv.value.siVal)
    return float(fv.value.ullVal)

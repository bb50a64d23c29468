"""XID error codes and their meaning, for the ``err_code``/``err_msg`` labels of
``DCGM_FI_DEV_XID_ERRORS`` (as dcgm-exporter writes them).

The texts are the short descriptions of NVIDIA's XID catalogue
(https://docs.nvidia.com/deploy/xid-errors/) for the codes an operator meets in practice; any
other code reads "Unknown XID error".
"""

from __future__ import annotations

__all__ = ["XID_DESCRIPTIONS", "xid_description"]

XID_DESCRIPTIONS: dict[int, str] = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: (
        "Preemptive cleanup, due to previous errors -- Most likely to see when running"
        " multiple cuda"
    ),
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
}


def xid_description(code: int) -> str:
    return XID_DESCRIPTIONS.get(code, "Unknown XID error")

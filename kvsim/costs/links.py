"""How fast KV moves between a GPU and its offload tiers: host memory over PCIe (or NVLink-C2C), disk over NVMe.

A load of ``bytes`` takes ``bytes / bandwidth``: the timed replay charges it to the step that
loads (``docs/offload.md``). The figures are one direction of the link as the vendor rates
it, a ceiling: pinned-memory copies reach about 80-90% of a PCIe link, and several GPUs on
one host share its root complex and its drives. ``--offload-bandwidth`` / ``--disk-bandwidth``
replace them (GB/s of 10^9 bytes).
"""
from __future__ import annotations

from kvsim.errors import ConfigError

GB = 1e9
#: host link per GPU (bytes/s, one direction): PCIe Gen4 x16 = 32 GB/s, Gen5 x16 = 64 GB/s;
#: the Grace Hopper superchip's NVLink-C2C = 450 GB/s per direction
HOST_LINK: dict[str, float] = {
    "H100": 64 * GB, "H100-80GB": 64 * GB, "H100-PCIe": 64 * GB, "H200": 64 * GB, "H200-NVL": 64 * GB,
    "GH200": 450 * GB, "B200": 64 * GB, "A100": 32 * GB, "A100-80GB": 32 * GB, "A100-40GB": 32 * GB,
    "L4": 32 * GB, "L40S": 32 * GB, "A10G": 32 * GB,
}
DEFAULT_HOST_LINK = 32 * GB        # PCIe Gen4 x16, when the GPU is not in the table
#: one NVMe Gen4 x4 drive's sequential read (bytes/s)
DEFAULT_DISK = 7 * GB


def host_link_bytes_per_s(gpu: str | None, override_gb_s: float | None = None) -> float:
    """The GPU <-> host link's bandwidth: ``--offload-bandwidth``, else the table for ``--gpu``."""
    if override_gb_s is not None:
        return _positive(override_gb_s, "--offload-bandwidth") * GB
    if not gpu:
        return DEFAULT_HOST_LINK
    key = gpu.upper()
    for name, rate in sorted(HOST_LINK.items(), key=lambda kv: -len(kv[0])):
        if key.startswith(name.upper()):
            return rate
    return DEFAULT_HOST_LINK


def disk_bytes_per_s(override_gb_s: float | None = None) -> float:
    """The local disk tier's read bandwidth: ``--disk-bandwidth``, else one NVMe Gen4 drive."""
    return DEFAULT_DISK if override_gb_s is None else _positive(override_gb_s, "--disk-bandwidth") * GB


def _positive(value: float, flag: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number of GB/s, got {value!r}") from None
    if not v > 0:
        raise ConfigError(f"{flag} must be positive GB/s, got {value!r}")
    return v

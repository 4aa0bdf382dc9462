"""NVIDIA boards by PCI device id: compute capability, memory and bandwidth.

nvidia-smi's card names change between drivers ("Tesla PG500-216" on old
drivers is a V100 PCIe 32GB) and drivers before 510 have no compute_cap
field, so llamarack identifies a card by its PCI device id (the query field
``pci.device_id``, known to every driver: ``0x1DB110DE`` is device 0x1DB1 of
vendor 0x10DE). The table is data in the code, not read from the host.

Sources:
- device ids and board names: Debian's pci.ids (package pci.ids
  0.0~2023.04.11-1, /usr/share/misc/pci.ids, vendor 10de), the Tesla,
  Quadro, GeForce, TITAN and data-centre (A/H/L) boards of the Maxwell to
  Hopper chips, but the laptops' (mobile, Max-Q: no rack holds one); the H200
  (0x2335, newer than that file) from the real H200 capture
  (``pci.device_id`` 0x233510DE, driver 580.159.04);
- compute capability by chip, as NVIDIA's CUDA GPUs page lists the boards
  (https://developer.nvidia.com/cuda-gpus): GM107/GM108 5.0, GM200/GM204/
  GM206 5.2, GP100 6.0, GP102-GP108 6.1, GV100 7.0, TU10x/TU11x 7.5,
  GA100 8.0, GA102-GA107 8.6, AD10x 8.9, GH100 9.0 (Jetson chips, which are
  not PCI boards, are left out);
- memory and bandwidth: NVIDIA's data sheets of each board.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional


def parse_compute_cap(text: Optional[str]) -> Optional[tuple[int, int]]:
    """(7, 0) from "7.0"; None for no value or one that is no number ("[N/A]")."""
    major, _, minor = (text or "").partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


NVIDIA_VENDOR_ID = 0x10DE

# device id -> (board name as pci.ids has it, chip, compute capability), and for the boards whose
# figures are known: memory GB as sold, memory bandwidth GB/s as the data sheet gives it (None:
# not known) and, where a real driver reported it, the smallest memory.total in MiB.
_CARDS: dict[int, tuple] = {
    0x137D: ("GeForce 940A", "GM108", "5.0"),
    0x1380: ("GeForce GTX 750 Ti", "GM107", "5.0"),
    0x1381: ("GeForce GTX 750", "GM107", "5.0"),
    0x1382: ("GeForce GTX 745", "GM107", "5.0"),
    0x1389: ("GRID M30", "GM107", "5.0"),
    0x139D: ("GeForce GTX 750 Ti", "GM107", "5.0"),
    0x13B9: ("NVS 810", "GM107", "5.0"),
    0x13BA: ("Quadro K2200", "GM107", "5.0"),
    0x13BB: ("Quadro K620", "GM107", "5.0"),
    0x13BC: ("Quadro K1200", "GM107", "5.0"),
    0x13BD: ("Tesla M10", "GM107", "5.0", 32, 332),  # 4 x 8 GB
    0x13C0: ("GeForce GTX 980", "GM204", "5.2"),
    0x13C2: ("GeForce GTX 970", "GM204", "5.2"),
    0x13D8: ("GeForce GTX 960 OEM / 970M", "GM204", "5.2"),
    0x13E7: ("GeForce GTX 980 Engineering Sample", "GM204", "5.2"),
    0x13F0: ("Quadro M5000", "GM204", "5.2"),
    0x13F1: ("Quadro M4000", "GM204", "5.2"),
    0x13F2: ("Tesla M60", "GM204", "5.2", 16, 320),  # 2 x 8 GB
    0x13F3: ("Tesla M6", "GM204", "5.2"),
    0x13FB: ("Quadro M5500", "GM204", "5.2"),
    0x1401: ("GeForce GTX 960", "GM206", "5.2"),
    0x1402: ("GeForce GTX 950", "GM206", "5.2"),
    0x1404: ("GeForce GTX 960 FAKE", "GM206", "5.2"),
    0x1406: ("GeForce GTX 960 OEM", "GM206", "5.2"),
    0x1407: ("GeForce GTX 750 v2", "GM206", "5.2"),
    0x1430: ("Quadro M2000", "GM206", "5.2"),
    0x1431: ("Tesla M4", "GM206", "5.2"),
    0x15F0: ("Quadro GP100", "GP100", "6.0"),
    0x15F7: ("Tesla P100 PCIe 12GB", "GP100", "6.0", 12, 549),
    0x15F8: ("Tesla P100 PCIe 16GB", "GP100", "6.0", 16, 732, 16280),  # 16280 to 16384 by driver
    0x15F9: ("Tesla P100 SXM2 16GB", "GP100", "6.0", 16, 732, 16280),
    0x1789: ("GRID M3-3020", "GM107", "5.0"),
    0x17C2: ("GeForce GTX TITAN X", "GM200", "5.2"),
    0x17C8: ("GeForce GTX 980 Ti", "GM200", "5.2"),
    0x17F0: ("Quadro M6000", "GM200", "5.2"),
    0x17F1: ("Quadro M6000 24GB", "GM200", "5.2"),
    0x17FD: ("Tesla M40", "GM200", "5.2", 24, 288),  # 24GB
    0x1AF1: ("A100 NVSwitch", "GA100", "8.0"),
    0x1B00: ("TITAN X", "GP102", "6.1"),
    0x1B01: ("GeForce GTX 1080 Ti 10GB", "GP102", "6.1"),
    0x1B02: ("TITAN Xp", "GP102", "6.1", 12, 548),
    0x1B06: ("GeForce GTX 1080 Ti", "GP102", "6.1", 11, 484),
    0x1B07: ("P102-100", "GP102", "6.1"),
    0x1B30: ("Quadro P6000", "GP102", "6.1"),
    0x1B38: ("Tesla P40", "GP102", "6.1", 24, 346),
    0x1B39: ("Tesla P10", "GP102", "6.1"),
    0x1B80: ("GeForce GTX 1080", "GP104", "6.1"),
    0x1B81: ("GeForce GTX 1070", "GP104", "6.1"),
    0x1B82: ("GeForce GTX 1070 Ti", "GP104", "6.1"),
    0x1B83: ("GeForce GTX 1060 6GB", "GP104", "6.1"),
    0x1B84: ("GeForce GTX 1060 3GB", "GP104", "6.1"),
    0x1B87: ("P104-100", "GP104", "6.1"),
    0x1BAD: ("GeForce GTX 1070 Engineering Sample", "GP104", "6.1"),
    0x1BB0: ("Quadro P5000", "GP104", "6.1"),
    0x1BB1: ("Quadro P4000", "GP104", "6.1"),
    0x1BB3: ("Tesla P4", "GP104", "6.1", 8, 192),
    0x1BB4: ("Tesla P6", "GP104", "6.1"),
    0x1BC7: ("P104-101", "GP104", "6.1"),
    0x1C02: ("GeForce GTX 1060 3GB", "GP106", "6.1"),
    0x1C03: ("GeForce GTX 1060 6GB", "GP106", "6.1"),
    0x1C04: ("GeForce GTX 1060 5GB", "GP106", "6.1"),
    0x1C06: ("GeForce GTX 1060 6GB Rev. 2", "GP106", "6.1"),
    0x1C07: ("P106-100", "GP106", "6.1"),
    0x1C09: ("P106-090", "GP106", "6.1"),
    0x1C30: ("Quadro P2000", "GP106", "6.1"),
    0x1C31: ("Quadro P2200", "GP106", "6.1"),
    0x1C81: ("GeForce GTX 1050", "GP107", "6.1"),
    0x1C82: ("GeForce GTX 1050 Ti", "GP107", "6.1"),
    0x1C83: ("GeForce GTX 1050 3GB", "GP107", "6.1"),
    0x1CB1: ("Quadro P1000", "GP107", "6.1"),
    0x1CB2: ("Quadro P600", "GP107", "6.1"),
    0x1CB3: ("Quadro P400", "GP107", "6.1"),
    0x1CB6: ("Quadro P620", "GP107", "6.1"),
    0x1CBD: ("Quadro P620", "GP107", "6.1"),
    0x1CFA: ("Quadro P2000", "GP107", "6.1"),
    0x1CFB: ("Quadro P1000", "GP107", "6.1"),
    0x1D01: ("GeForce GT 1030", "GP108", "6.1"),
    0x1D02: ("GeForce GT 1010", "GP108", "6.1"),
    0x1D34: ("Quadro P520", "GP108", "6.1"),
    0x1D81: ("TITAN V", "GV100", "7.0", 12, 653),
    0x1DB1: ("Tesla V100 SXM2 16GB", "GV100", "7.0", 16, 900, 16130),  # 16130, 16160 or 16384 by driver
    0x1DB2: ("Tesla V100 DGXS 16GB", "GV100", "7.0"),
    0x1DB3: ("Tesla V100 FHHL 16GB", "GV100", "7.0"),
    0x1DB4: ("Tesla V100 PCIe 16GB", "GV100", "7.0", 16, 900, 16130),
    0x1DB5: ("Tesla V100 SXM2 32GB", "GV100", "7.0", 32, 900),
    0x1DB6: ("Tesla V100 PCIe 32GB", "GV100", "7.0", 32, 900),
    0x1DB7: ("Tesla V100 DGXS 32GB", "GV100", "7.0"),
    0x1DB8: ("Tesla V100 SXM3 32GB", "GV100", "7.0", 32, None, 32510),  # 32510 MiB: rapidsai/dask-cuda#859
    0x1DBA: ("Quadro GV100", "GV100", "7.0", 32, 870),
    0x1DF0: ("Tesla PG500-216", "GV100", "7.0", 32, 900),  # V100 PCIe 32GB on old drivers
    0x1DF2: ("Tesla PG503-216", "GV100", "7.0"),
    0x1DF5: ("Tesla V100 SXM2 16GB", "GV100", "7.0", 16, 900, 16130),
    0x1DF6: ("Tesla V100S PCIe 32GB", "GV100", "7.0", 32, 1134),
    0x1E02: ("TITAN RTX", "TU102", "7.5"),
    0x1E03: ("GeForce RTX 2080 Ti 12GB", "TU102", "7.5"),
    0x1E04: ("GeForce RTX 2080 Ti", "TU102", "7.5"),
    0x1E07: ("GeForce RTX 2080 Ti Rev. A", "TU102", "7.5"),
    0x1E09: ("CMP 50HX", "TU102", "7.5"),
    0x1E2D: ("GeForce RTX 2080 Ti Engineering Sample", "TU102", "7.5"),
    0x1E2E: ("GeForce RTX 2080 Ti 12GB Engineering Sample", "TU102", "7.5"),
    0x1E30: ("Quadro RTX 6000/8000", "TU102", "7.5", 24, 672),  # the 6000's 24 GB: the smaller
    0x1E36: ("Quadro RTX 6000", "TU102", "7.5"),
    0x1E37: ("Tesla T10 16GB / GRID RTX T10-2/T10-4/T10-8", "TU102", "7.5"),
    0x1E38: ("Tesla T40 24GB", "TU102", "7.5"),
    0x1E78: ("Quadro RTX 6000/8000", "TU102", "7.5"),
    0x1E81: ("GeForce RTX 2080 SUPER", "TU104", "7.5"),
    0x1E82: ("GeForce RTX 2080", "TU104", "7.5"),
    0x1E84: ("GeForce RTX 2070 SUPER", "TU104", "7.5"),
    0x1E87: ("GeForce RTX 2080 Rev. A", "TU104", "7.5"),
    0x1E89: ("GeForce RTX 2060", "TU104", "7.5"),
    0x1EAE: ("GeForce GTX 2080 Engineering Sample", "TU104", "7.5"),
    0x1EB0: ("Quadro RTX 5000", "TU104", "7.5"),
    0x1EB1: ("Quadro RTX 4000", "TU104", "7.5"),
    0x1EB4: ("T4G", "TU104", "7.5"),
    0x1EB8: ("Tesla T4", "TU104", "7.5", 16, 320),
    0x1EBA: ("PG189 SKU600", "TU104", "7.5"),
    0x1EC2: ("GeForce RTX 2070 SUPER", "TU104", "7.5"),
    0x1EC7: ("GeForce RTX 2070 SUPER", "TU104", "7.5"),
    0x1F02: ("GeForce RTX 2070", "TU106", "7.5"),
    0x1F03: ("GeForce RTX 2060 12GB", "TU106", "7.5"),
    0x1F06: ("GeForce RTX 2060 SUPER", "TU106", "7.5"),
    0x1F07: ("GeForce RTX 2070 Rev. A", "TU106", "7.5"),
    0x1F08: ("GeForce RTX 2060 Rev. A", "TU106", "7.5"),
    0x1F09: ("GeForce GTX 1660 SUPER", "TU106", "7.5"),
    0x1F0A: ("GeForce GTX 1650", "TU106", "7.5"),
    0x1F0B: ("CMP 40HX", "TU106", "7.5"),
    0x1F42: ("GeForce RTX 2060 SUPER", "TU106", "7.5"),
    0x1F47: ("GeForce RTX 2060 SUPER", "TU106", "7.5"),
    0x1F82: ("GeForce GTX 1650", "TU117", "7.5"),
    0x1F83: ("GeForce GTX 1630", "TU117", "7.5"),
    0x1FB1: ("T600", "TU117", "7.5"),
    0x1FF0: ("T1000 8GB", "TU117", "7.5"),
    0x1FF2: ("T400 4GB", "TU117", "7.5"),
    0x2082: ("CMP 170HX", "GA100", "8.0"),
    0x20B0: ("A100 SXM4 40GB", "GA100", "8.0", 40, 1555),
    0x20B1: ("A100 PCIe 40GB", "GA100", "8.0", 40, 1555),
    0x20B2: ("A100 SXM4 80GB", "GA100", "8.0", 80, 2039),
    0x20B3: ("A100-SXM-64GB", "GA100", "8.0"),
    0x20B5: ("A100 PCIe 80GB", "GA100", "8.0", 80, 1935),
    0x20B6: ("PG506-232", "GA100", "8.0"),
    0x20B7: ("A30 PCIe", "GA100", "8.0", 24, 933),
    0x20B8: ("A100X", "GA100", "8.0"),
    0x20B9: ("A30X", "GA100", "8.0"),
    0x20BB: ("DRIVE A100 PROD", "GA100", "8.0"),
    0x20BE: ("GRID A100A", "GA100", "8.0"),
    0x20BF: ("GRID A100B", "GA100", "8.0"),
    0x20C2: ("CMP 170HX", "GA100", "8.0"),
    0x20F0: ("A100-PG506-207", "GA100", "8.0"),
    0x20F1: ("A100 PCIe 40GB", "GA100", "8.0", 40, 1555),
    0x20F2: ("A100-PG506-217", "GA100", "8.0"),
    0x20F3: ("A800-SXM4-80GB", "GA100", "8.0"),
    0x20F5: ("A800 80GB PCIe", "GA100", "8.0"),
    0x20F6: ("A800 40GB PCIe", "GA100", "8.0"),
    0x20FD: ("A100T", "GA100", "8.0"),
    0x2182: ("GeForce GTX 1660 Ti", "TU116", "7.5"),
    0x2184: ("GeForce GTX 1660", "TU116", "7.5"),
    0x2187: ("GeForce GTX 1650 SUPER", "TU116", "7.5"),
    0x2188: ("GeForce GTX 1650", "TU116", "7.5"),
    0x2189: ("CMP 30HX", "TU116", "7.5"),
    0x21C4: ("GeForce GTX 1660 SUPER", "TU116", "7.5"),
    0x2203: ("GeForce RTX 3090 Ti", "GA102", "8.6"),
    0x2204: ("GeForce RTX 3090", "GA102", "8.6", 24, 936),
    0x2205: ("GeForce RTX 3080 Ti 20GB", "GA102", "8.6"),
    0x2206: ("GeForce RTX 3080", "GA102", "8.6"),
    0x2207: ("GeForce RTX 3070 Ti", "GA102", "8.6"),
    0x2208: ("GeForce RTX 3080 Ti", "GA102", "8.6"),
    0x220A: ("GeForce RTX 3080 12GB", "GA102", "8.6"),
    0x220D: ("CMP 90HX", "GA102", "8.6"),
    0x2216: ("GeForce RTX 3080 Lite Hash Rate", "GA102", "8.6"),
    0x222B: ("GeForce RTX 3090 Engineering Sample", "GA102", "8.6"),
    0x222F: ("GeForce RTX 3080 11GB / 12GB Engineering Sample", "GA102", "8.6"),
    0x2230: ("RTX A6000", "GA102", "8.6", 48, 768),
    0x2231: ("RTX A5000", "GA102", "8.6"),
    0x2232: ("RTX A4500", "GA102", "8.6"),
    0x2233: ("RTX A5500", "GA102", "8.6"),
    0x2235: ("A40", "GA102", "8.6", 48, 696),
    0x2236: ("A10", "GA102", "8.6", 24, 600),
    0x2237: ("A10G", "GA102", "8.6"),
    0x2238: ("A10M", "GA102", "8.6"),
    0x2313: ("H100 CNX", "GH100", "9.0"),
    0x2322: ("H800 PCIe", "GH100", "9.0"),
    0x2324: ("H800", "GH100", "9.0"),
    0x2330: ("H100 SXM5 80GB", "GH100", "9.0", 80, 3350, 81559),  # 81559 MiB reported
    0x2331: ("H100 PCIe", "GH100", "9.0", 80, 2000),
    0x2335: ("H200", "GH100", "9.0", 141, 4800, 143771),  # 143771 MiB: the real capture
    0x2336: ("H100", "GH100", "9.0"),
    0x2339: ("H100", "GH100", "9.0"),
    0x2414: ("GeForce RTX 3060 Ti", "GA103", "8.6"),
    0x2482: ("GeForce RTX 3070 Ti", "GA104", "8.6"),
    0x2484: ("GeForce RTX 3070", "GA104", "8.6"),
    0x2486: ("GeForce RTX 3060 Ti", "GA104", "8.6"),
    0x2487: ("GeForce RTX 3060", "GA104", "8.6"),
    0x2488: ("GeForce RTX 3070 Lite Hash Rate", "GA104", "8.6"),
    0x2489: ("GeForce RTX 3060 Ti Lite Hash Rate", "GA104", "8.6"),
    0x248A: ("CMP 70HX", "GA104", "8.6"),
    0x24AC: ("GeForce RTX 30x0 Engineering Sample", "GA104", "8.6"),
    0x24AD: ("GeForce RTX 3060 Engineering Sample", "GA104", "8.6"),
    0x24AF: ("GeForce RTX 3070 Engineering Sample", "GA104", "8.6"),
    0x24B0: ("RTX A4000", "GA104", "8.6"),
    0x24B1: ("RTX A4000H", "GA104", "8.6"),
    0x24BF: ("GeForce RTX 3070 Engineering Sample", "GA104", "8.6"),
    0x24C7: ("GeForce RTX 3060 GDDR6X", "GA104", "8.6"),
    0x24C8: ("GeForce RTX 3070 GDDR6X", "GA104", "8.6"),
    0x24C9: ("GeForce RTX 3060 Ti GDDR6X", "GA104", "8.6"),
    0x24FA: ("RTX A4500 Embedded GPU ", "GA104", "8.6"),
    0x2501: ("GeForce RTX 3060", "GA106", "8.6"),
    0x2503: ("GeForce RTX 3060", "GA106", "8.6"),
    0x2504: ("GeForce RTX 3060 Lite Hash Rate", "GA106", "8.6"),
    0x2507: ("Geforce RTX 3050", "GA106", "8.6"),
    0x2508: ("GeForce RTX 3050 OEM", "GA106", "8.6"),
    0x2509: ("GeForce RTX 3060 12GB Rev. 2", "GA106", "8.6"),
    0x252F: ("GeForce RTX 3060 Engineering Sample", "GA106", "8.6"),
    0x2531: ("RTX A2000", "GA106", "8.6"),
    0x2544: ("GeForce RTX 3060", "GA106", "8.6"),
    0x2571: ("RTX A2000 12GB", "GA106", "8.6"),
    0x2582: ("GeForce RTX 3050 8GB", "GA107", "8.6"),
    0x2583: ("GeForce RTX 3050 4GB", "GA107", "8.6"),
    0x25A9: ("GeForce RTX 2050", "GA107", "8.6"),
    0x25AD: ("GeForce RTX 2050", "GA107", "8.6"),
    0x25AF: ("GeForce RTX 3050 Engineering Sample", "GA107", "8.6"),
    0x25B6: ("A2 / A16", "GA107", "8.6"),
    0x25ED: ("GeForce RTX 2050", "GA107", "8.6"),
    0x25F9: ("RTX A1000 Embedded GPU ", "GA107", "8.6"),
    0x25FA: ("RTX A2000 Embedded GPU", "GA107", "8.6"),
    0x25FB: ("RTX A500 Embedded GPU", "GA107", "8.6"),
    0x2681: ("RTX TITAN Ada", "AD102", "8.9"),
    0x2684: ("GeForce RTX 4090", "AD102", "8.9", 24, 1008),
    0x26B1: ("L6000 / RTX 6000 Ada Generation", "AD102", "8.9"),
    0x26B5: ("L40", "AD102", "8.9", 48, 864),
    0x26B8: ("L40G", "AD102", "8.9"),
    0x26F5: ("L40 CNX", "AD102", "8.9"),
    0x2704: ("GeForce RTX 4080", "AD103", "8.9"),
    0x2782: ("GeForce RTX 4070 Ti", "AD104", "8.9"),
    0x2786: ("GeForce RTX 4070", "AD104", "8.9"),
    0x27B0: ("RTX 4000 SFF Ada Generation", "AD104", "8.9"),
    0x27B7: ("L16", "AD104", "8.9"),
    0x27B8: ("L4", "AD104", "8.9", 24, 300),
    0x2803: ("GeForce RTX 4060 Ti", "AD106", "8.9"),
}


# GB as sold are GiB on these boards (HBM stacks and GDDR chips come in
# powers of two); the driver reserves a little of it, more with ECC on GDDR.
# Without a real report, planning assumes the largest reservation seen on a
# known board of the kind: ECC on GDDR takes 1/16 of the memory; HBM keeps its
# ECC beside the data, and its boards report within 1/64 of the nominal (V100
# 16130 of 16384, V100 SXM3 32510 of 32768, P100 16280, H100 81559 of 81920).
_UNREPORTED_RESERVE = 16
_HBM_CHIPS = frozenset({"GP100", "GV100", "GA100", "GH100"})
_UNREPORTED_RESERVE_HBM = 64


@dataclass(frozen=True)
class Board:
    """A board of ``_CARDS`` with its memory figures (None where not known)."""

    device_id: int
    name: str
    chip: str
    compute_cap: str
    memory_gb: Optional[int] = None
    bandwidth_gbs: Optional[int] = None
    min_reported_mib: Optional[int] = None


BOARDS: dict[int, Board] = {dev: Board(dev, *row) for dev, row in _CARDS.items()}

_PCI_ID = re.compile(r"0x([0-9A-Fa-f]{4})([0-9A-Fa-f]{4})")


def device_id(pci_device_id) -> Optional[int]:
    """The device part of nvidia-smi's ``pci.device_id`` ("0x1DB110DE" -> 0x1DB1); a number is one
    already. None for anything else ([N/A], another vendor's id, a missing field)."""
    if isinstance(pci_device_id, int):
        return pci_device_id
    match = _PCI_ID.fullmatch((pci_device_id or "").strip())
    if not match or int(match.group(2), 16) != NVIDIA_VENDOR_ID:
        return None
    return int(match.group(1), 16)


def board(pci_device_id) -> Optional[Board]:
    """The board of a PCI device id (nvidia-smi's text or the number), or None."""
    return BOARDS.get(device_id(pci_device_id))


def compute_cap(pci_device_id) -> Optional[str]:
    """The compute capability ("7.0") of a PCI device id, or None for a card not in the table."""
    found = board(pci_device_id)
    return found.compute_cap if found else None


def planning_memory_mib(pci_device_id, reported_mib: int) -> int:
    """The memory (MiB) to plan a card's context with: the same for the same board whatever the driver
    reports (a V100 16GB reports 16130, 16160 or 16384). That is the board's smallest real report, else
    its nominal memory less the reservation above; never more than this driver reports (ECC on, or
    retired pages, leave less). A card not in the table (or without memory figures): what it reports."""
    found = board(pci_device_id)
    if found is None or found.memory_gb is None:
        return reported_mib
    nominal = found.memory_gb * 1024
    reserve = _UNREPORTED_RESERVE_HBM if found.chip in _HBM_CHIPS else _UNREPORTED_RESERVE
    return min(found.min_reported_mib or nominal - nominal // reserve, reported_mib)

"""Node shapes: the GPU servers one can run or buy, named, by the GPU models they hold.

Product data (the fleet planner's capacity replay adds idle nodes of a shape; `gpu-agent
--simulate <shape>` simulates one): a shape names models of ``agent.gpu.models``, in NVML index
order. How a simulated node of a shape behaves (driver version, NVLink, CPUs) is the
simulator's, in ``agent.gpu.sim.presets``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import FieldViolation, InvalidSpec

__all__ = ["SHAPES", "NodeShape", "get_shape"]


@dataclass(frozen=True, slots=True)
class NodeShape:
    name: str
    description: str
    #: model keys (agent.gpu.models.MODELS), in NVML index order
    gpus: tuple[str, ...]


_SHAPE_LIST = (
    NodeShape(
        "dgx-a100",
        "DGX A100: 8x A100-SXM4-40GB",
        ("A100-SXM4-40GB",) * 8,
    ),
    NodeShape(
        "dgx-a100-80",
        "DGX A100 80GB: 8x A100-SXM4-80GB",
        ("A100-SXM4-80GB",) * 8,
    ),
    NodeShape(
        "a30-node",
        "PCIe server with 4x A30 (4-slice MIG grid)",
        ("A30",) * 4,
    ),
    NodeShape(
        "dgx-h100",
        "DGX H100: 8x H100 SXM5 80GB",
        ("H100-SXM5-80GB",) * 8,
    ),
    NodeShape(
        "h100-nvl",
        "PCIe server with 2x H100 NVL 94GB (one NVLink-bridged pair)",
        ("H100-NVL-94GB",) * 2,
    ),
    NodeShape(
        "hgx-h200",
        "HGX H200: 8x H200 SXM 141GB",
        ("H200-SXM-141GB",) * 8,
    ),
    NodeShape(
        "gh200",
        "4x GH200 superchip (H100 96GB HBM3) node",
        ("GH200-96GB",) * 4,
    ),
    NodeShape(
        "gh200-144",
        "4x GH200 144G HBM3e superchip node",
        ("GH200-144GB",) * 4,
    ),
    NodeShape(
        "hgx-h20",
        "HGX H20: 8x H20 96GB",
        ("H20",) * 8,
    ),
    NodeShape(
        "dgx-b200",
        "DGX B200: 8x B200 180GB",
        ("B200",) * 8,
    ),
    NodeShape(
        "rtx-pro-6000",
        "RTX PRO server: 8x RTX PRO 6000 Blackwell Server Edition 96GB (4-slice MIG)",
        ("RTX-PRO-6000-96GB",) * 8,
    ),
    NodeShape(
        "mixed",
        "Two models on one node: 4x A100-SXM4-80GB then 4x H100 SXM5 80GB",
        ("A100-SXM4-80GB",) * 4 + ("H100-SXM5-80GB",) * 4,
    ),
)

SHAPES: dict[str, NodeShape] = {s.name: s for s in _SHAPE_LIST}


def get_shape(name: str, field: str = "preset") -> NodeShape:
    """The shape called ``name``; refused naming ``field`` and the shapes there are."""
    try:
        return SHAPES[name]
    except KeyError:
        allowed = ", ".join(SHAPES)
        raise InvalidSpec(
            f"unknown simulator preset {name!r}; allowed: {allowed}",
            [FieldViolation(field, f"must be one of: {allowed}")],
        ) from None

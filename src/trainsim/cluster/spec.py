"""A cluster: nodes x devices per node, the links inside and between nodes, and the collective topology.

    >>> from trainsim.cluster.spec import cluster
    >>> c = cluster(nodes=4, devices_per_node=8, device="a100-80gb", intra="nvlink3", inter="ib-hdr")
    >>> c.world_size, c.topology
    (32, 'ring')

Or from a small file (``load_cluster("my.toml")``; YAML takes the same keys)::

    nodes = 2
    devices_per_node = 4
    device = "h100-sxm"
    intra_link = "nvlink4"
    inter_link = { bw_gbyte_s = 12.5, latency_us = 15 }  # GB/s (bw_gbps, its old name, too); or "eth-100g"
    topology = "hierarchical"                             # ring | tree | hierarchical | ps
    ps_servers = 2                                        # ps only
    ps_colocated = true                                   # ps only: servers run on worker nodes

Every mistake (unknown name, a bandwidth <= 0, a field that does not exist) is a one-line ``UserError``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.cluster.catalog import Device, Link, device, link
from trainsim.errors import UserError

TOPOLOGIES = ("ring", "tree", "hierarchical", "ps")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """Validated cluster description (build with ``cluster`` or ``load_cluster``)."""

    nodes: int
    """machines"""
    devices_per_node: int
    """accelerators (ranks) per machine"""
    device: Device
    """accelerator model of every rank"""
    intra: Link
    """link between devices of one node"""
    inter: Link
    """link between nodes (each node's NIC, per direction)"""
    topology: str = "ring"
    """collective algorithm for gradient sync: ring | tree | hierarchical | ps"""
    ps_servers: int = 0
    """parameter servers (topology 'ps'); 0 means one per node"""
    ps_colocated: bool = True
    """parameter servers share the worker nodes' NICs (BytePS-style separate servers when False)"""
    source: str = "<python>"

    def __post_init__(self) -> None:
        where = self.source
        for f in ("nodes", "devices_per_node"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"{where}: {f}={v!r}; expected a positive integer")
        if self.topology not in TOPOLOGIES:
            raise UserError(f"{where}: topology={self.topology!r}; expected one of {', '.join(TOPOLOGIES)}")
        if not isinstance(self.ps_servers, int) or self.ps_servers < 0:
            raise UserError(f"{where}: ps_servers={self.ps_servers!r}; expected an integer >= 0")

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def n_servers(self) -> int:
        return self.ps_servers or self.nodes

    def check_ranks(self, ranks: int) -> None:
        """``UserError`` when a job wants more ranks than the cluster has."""
        if ranks > self.world_size:
            raise UserError(
                f"{self.source}: {ranks} ranks requested but the cluster has {self.nodes} nodes x "
                f"{self.devices_per_node} devices = {self.world_size}"
            )

    def describe(self) -> str:
        return (
            f"{self.nodes}x{self.devices_per_node} {self.device.name}, intra {self.intra.name}"
            f" ({self.intra.bw_gbyte_s:g} GB/s), inter {self.inter.name} ({self.inter.bw_gbyte_s:g} GB/s,"
            f" {self.inter.latency_us:g} us), {self.topology}"
        )


def _link_of(value: object, where: str) -> Link:
    if isinstance(value, Link):
        return value
    if isinstance(value, str):
        return link(value)
    if isinstance(value, Mapping):
        unknown = set(value) - {"name", "bw_gbyte_s", "bw_gbps", "latency_us", "gbit", "source"}
        if unknown:
            raise UserError(f"{where}: unknown link field(s) {sorted(unknown)}; expected bw_gbyte_s, latency_us")
        bw = value.get("bw_gbyte_s", value.get("bw_gbps", None))
        if bw is None and "gbit" in value:
            bw = float(value["gbit"]) / 8
        if bw is None:
            raise UserError(f"{where}: a link needs bw_gbyte_s (GB/s per direction) or gbit (Gbit/s)")
        try:
            return Link(
                name=str(value.get("name", "custom")),
                bw_gbyte_s=float(bw),
                latency_us=float(value.get("latency_us", 0.0)),
                source=str(value.get("source", "user-given")),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, UserError):
                raise UserError(f"{where}: {exc}") from None
            raise UserError(f"{where}: link values must be numbers, got {dict(value)}") from None
    raise UserError(f"{where}: a link is a catalog name or a table with bw_gbyte_s/latency_us, got {value!r}")


def cluster(
    *,
    nodes: int = 1,
    devices_per_node: int = 1,
    device: str | Device = "this-cpu",
    intra: str | Link | Mapping[str, Any] = "pcie4-x16",
    inter: str | Link | Mapping[str, Any] = "eth-10g",
    topology: str = "ring",
    ps_servers: int = 0,
    ps_colocated: bool = True,
    source: str = "<python>",
) -> ClusterSpec:
    """Build a ``ClusterSpec`` from catalog names (or ``Device``/``Link`` objects, or link tables)."""
    dev = device if isinstance(device, Device) else _device_of(device, source)
    return ClusterSpec(
        nodes=nodes,
        devices_per_node=devices_per_node,
        device=dev,
        intra=_link_of(intra, f"{source}: intra_link"),
        inter=_link_of(inter, f"{source}: inter_link"),
        topology=topology,
        ps_servers=ps_servers,
        ps_colocated=ps_colocated,
        source=source,
    )


def _device_of(name: object, where: str) -> Device:
    if not isinstance(name, str):
        raise UserError(f"{where}: device={name!r}; expected a catalog name")
    try:
        return device(name)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


_FILE_KEYS = {"nodes", "devices_per_node", "device", "intra_link", "inter_link", "topology", "ps_servers", "ps_colocated"}


def cluster_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> ClusterSpec:
    """A ``ClusterSpec`` from the keys a cluster file holds."""
    if not isinstance(data, Mapping):
        raise UserError(f"{source}: expected a table of cluster keys, got {type(data).__name__}")
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise UserError(f"{source}: unknown key(s) {sorted(unknown)}; expected some of {sorted(_FILE_KEYS)}")
    try:
        return cluster(
            nodes=data.get("nodes", 1),
            devices_per_node=data.get("devices_per_node", 1),
            device=data.get("device", "this-cpu"),
            intra=data.get("intra_link", "pcie4-x16"),
            inter=data.get("inter_link", "eth-10g"),
            topology=data.get("topology", "ring"),
            ps_servers=data.get("ps_servers", 0),
            ps_colocated=bool(data.get("ps_colocated", True)),
            source=source,
        )
    except UserError as exc:
        msg = str(exc)
        raise UserError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster from a ``.toml``, ``.yaml`` or ``.yml`` file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such cluster file")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            data: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise UserError(f"{p}: unknown cluster file type {p.suffix!r}; expected .toml, .yaml or .yml")
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{p}: cannot parse: {' '.join(str(exc).split())}") from None
    return cluster_from_dict(data or {}, str(p))

"""Per-component power and cost defaults for capacity planning, and the ``plan:`` section that overrides them.

Every number below is a *default*: a planner with a quote or a measured
figure overrides it (``plan.components``). Each carries its source: a vendor
document where one states the number, otherwise ``"estimate"`` with the
reasoning. List prices of data-centre networking are rarely public, so
**every cost is an estimate**; treat fabric costs as relative (which of two
fabrics costs more, and by how much), not as a quote.

Power (watts, per unit, switches *without* their optics, which are counted
as transceivers)
------------------------------------------------------------------------

* Transceivers, per port end (one end of one optical cable):
  200G 5 W, 400G 9 W, 800G 17 W. NVIDIA's MMS4X00-NS400 400G OSFP module
  draws 9 W in 400G mode and 5 W in 200G mode; the twin-port 2x400G OSFP
  (MMS4X00-NS-T) draws 17 W, i.e. 8.5 W per 400G port and 17 W per 800G cage
  (NVIDIA transceiver product specifications, docs.nvidia.com/networking).
* Active optical cables: the optics of both ends (2 x the per-end figure).
  Passive copper (DAC) draws no port power ("all cable types except passive
  copper draw power from the port", NVIDIA DGX SuperPOD cabling guide, "Port
  Power"); fibre draws none either.
* Switch chassis (ASIC, CPU, fans, PSU losses; estimates, no public typical
  figure was found): QM8700 HDR 40x200G 250 W; QM9700 NDR 64x400G 700 W (its
  51.2 Tb/s ASIC class; the QM97xx manual lists Class 8, 17 W, OSFP modules
  on top); SN5600 Spectrum-4 51.2 Tb/s 1,000 W (ships with dual 3 kW PSUs
  sized for 64 x 18 W optics on top, NVIDIA SN5000 manual); Q3400
  Quantum-X800 144x800G (four ASICs) 3,000 W.
* NICs (estimates from the cards' PCIe slot class): ConnectX-6 200G 20 W,
  ConnectX-7 400G 25 W, ConnectX-8 800G 35 W, without the NIC-side optics.
* NVSwitch chips (estimate, no public per-chip figure): 100 W each,
  including its share of the baseboard or switch tray.
* GPUs (datasheets, maximum board power): A100 SXM 400 W, H100 SXM 700 W,
  H200 SXM 700 W, B200 1,000 W, GB200 1,200 W, GB300 1,400 W (per-GPU TDPs
  of the NVL72 parts). Counted apart from the fabric.

Cost (US dollars per unit; all estimates, override with quotes)
---------------------------------------------------------------

* Switches: QM8700 $15k, QM9700 $30k, SN5600 $45k, Q3400 $120k
  (street prices of the order resellers advertise; a bigger radix costs
  more, which keeps "more oversubscription never costs more").
* NICs: ConnectX-6 $1,200, ConnectX-7 $2,000, ConnectX-8 $3,000.
* Optics per port end: 200G $400, 400G $800, 800G $1,200; AOC per cable
  2 x that less 10%; DAC per cable 200G $150, 400G $250, 800G $400; fibre
  per optical cable $100 (MPO-12, tens of metres).
* NVSwitch chip: $5,000 (no public price; a share of an HGX baseboard or
  NVL72 switch tray).
* GPUs: A100 $15k, H100 $30k, H200 $35k, B200 $45k, GB200 $50k, GB300 $60k.

NVSwitch chips per NVLink domain
--------------------------------

The ``n`` GPUs around one ``nvswitch`` node of the graph get
``max(ceil((n * L + T) / P), B * ceil(n / 8))`` NVSwitch chips, where ``L`` is
NVLink links per GPU, ``P`` NVLink ports per switch chip, ``B`` the chips on
that generation's 8-GPU HGX baseboard and ``T`` the NVLink links from that
NVSwitch to other NVSwitches (its links to them over the bandwidth of one
NVLink link, a GPU's NVLink bandwidth over ``L``); a one-GPU domain gets none.
A domain's count is the sum over its NVSwitch nodes.
Generations by the GPU's ``arch``: sm80 (A100) NVSwitch gen 2, L 12, P 36, B 6;
sm90 (H100, H200) gen 3, L 18, P 64, B 4; sm100 (B200, GB200) gen 4, L 18,
P 72, B 2. That gives DGX A100 6, DGX H100 4, DGX B200 2 and a GB200 NVL72
rack 18 (= its 9 switch trays x 2 chips), the published counts. A GB200
NVL36x2 domain (two racks of 36 GPUs whose switches give half their ports to
the other rack: ``T`` = 36 x 18 per rack) gets 2 x 18 = 36, NVIDIA's 9 NVL36
NVLink switch trays per rack (Multi-Node NVLink tuning guide, "The 36x2
Configuration"). Domains of more than 8 GPUs also show the chips as switch
trays of two.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from topologies.cluster import PicklesProxies, TopologyError
from topologies.units import parse_bandwidth

__all__ = [
    "Component",
    "COMPONENTS",
    "SwitchModel",
    "SWITCH_MODELS",
    "NVSWITCH_GENERATIONS",
    "MEDIA",
    "FAMILIES",
    "PlanOptions",
    "plan_options",
    "nvswitch_chips",
]

_G = 1e9 / 8  # one Gb/s in bytes/s


@dataclass(frozen=True)
class Component:
    """One priced part: watts and US dollars per unit, and where each number comes from."""

    name: str
    power_w: float
    cost_usd: float
    power_source: str
    cost_source: str = "estimate"


@dataclass(frozen=True)
class SwitchModel:
    """A switch as its ports are configured: ``ports`` logical ports of ``port_Gbps`` each."""

    component: str
    family: str
    ports: int
    port_Gbps: int

    @property
    def spec(self) -> str:
        return f"{self.ports}x{self.port_Gbps}G"


def _c(name: str, power_w: float, cost_usd: float, power_source: str, cost_source: str = "estimate") -> Component:
    return Component(name, power_w, cost_usd, power_source, cost_source)


_DS_OPTICS = "NVIDIA MMS4X00-NS400 / MMS4X00-NS-T product specifications"
COMPONENTS: Mapping[str, Component] = MappingProxyType({c.name: c for c in (
    # switches (chassis without optics)
    _c("QM8700", 250, 15_000, "estimate: HDR 40-port 1U chassis"),
    _c("QM9700", 700, 30_000, "estimate: 51.2 Tb/s Quantum-2 chassis, optics extra"),
    _c("SN5600", 1_000, 45_000, "estimate: 51.2 Tb/s Spectrum-4 chassis, optics extra"),
    _c("Q3400", 3_000, 120_000, "estimate: four-ASIC Quantum-X800 chassis, optics extra"),
    # NICs
    _c("ConnectX-6", 20, 1_200, "estimate: PCIe Gen4 x16 HDR card"),
    _c("ConnectX-7", 25, 2_000, "estimate: PCIe Gen5 x16 NDR card"),
    _c("ConnectX-8", 35, 3_000, "estimate: PCIe Gen6 800G SuperNIC"),
    # optics, per port end, and cables, per cable
    _c("transceiver-200G", 5, 400, f"{_DS_OPTICS} (200G mode: 5 W)"),
    _c("transceiver-400G", 9, 800, f"{_DS_OPTICS} (400G: 9 W; twin-port 17 W / 2)"),
    _c("transceiver-800G", 17, 1_200, f"{_DS_OPTICS} (twin-port 2x400G OSFP: 17 W)"),
    _c("aoc-200G", 10, 720, "estimate: optics of both ends"),
    _c("aoc-400G", 18, 1_440, "estimate: optics of both ends"),
    _c("aoc-800G", 34, 2_160, "estimate: optics of both ends"),
    _c("dac-200G", 0, 150, "NVIDIA DGX SuperPOD cabling guide: passive copper draws no port power"),
    _c("dac-400G", 0, 250, "NVIDIA DGX SuperPOD cabling guide: passive copper draws no port power"),
    _c("dac-800G", 0, 400, "NVIDIA DGX SuperPOD cabling guide: passive copper draws no port power"),
    _c("fiber", 0, 100, "passive"),
    # NVLink switch chips
    _c("NVSwitch-gen2", 100, 5_000, "estimate: incl. share of the HGX A100 baseboard"),
    _c("NVSwitch-gen3", 100, 5_000, "estimate: incl. share of the HGX H100 baseboard"),
    _c("NVSwitch-gen4", 100, 5_000, "estimate: incl. share of the HGX B200 board / NVL72 switch tray"),
    # GPUs (counted apart from the fabric)
    _c("A100-80GB-SXM", 400, 15_000, "NVIDIA A100 datasheet: 400 W max TDP (SXM)"),
    _c("H100-SXM", 700, 30_000, "NVIDIA H100 datasheet: up to 700 W (SXM)"),
    _c("H200-SXM", 700, 35_000, "NVIDIA H200 datasheet: up to 700 W (SXM)"),
    _c("B200", 1_000, 45_000, "NVIDIA HGX B200 datasheet: ~1,000 W per GPU"),
    _c("GB200", 1_200, 50_000, "GB200 NVL72: 1,200 W per GPU (Grace-Blackwell part); cost an estimate (a ~$3.5M "
                               "rack over 72 GPUs, less switch trays, CPUs and NICs counted elsewhere)"),
    _c("GB300", 1_400, 60_000, "GB300 NVL72: 1,400 W per GPU (Blackwell Ultra); cost an estimate"),
)})
"""Every priced part by name; ``plan.components`` overrides these numbers by the same names."""

SWITCH_MODELS: tuple[SwitchModel, ...] = (
    SwitchModel("QM8700", "infiniband", 40, 200),
    SwitchModel("QM9700", "infiniband", 128, 200),  # NDR200: each 400G port split in two
    SwitchModel("QM9700", "infiniband", 64, 400),
    SwitchModel("Q3400", "infiniband", 144, 800),
    SwitchModel("SN5600", "ethernet", 256, 200),
    SwitchModel("SN5600", "ethernet", 128, 400),
    SwitchModel("SN5600", "ethernet", 64, 800),
)
"""Switch configurations the planner picks from (NVIDIA datasheets: QM8700 40x HDR 200G; QM9700 64x NDR 400G or
128x NDR200; Q3400 144x XDR 800G; SN5600 64x 800GbE, split to 128x400 or 256x200)."""

NIC_MODELS: tuple[tuple[int, str], ...] = ((200, "ConnectX-6"), (400, "ConnectX-7"), (800, "ConnectX-8"))
"""NIC by port speed (Gb/s): the slowest that is at least the NIC link's rate."""


@dataclass(frozen=True)
class NVSwitchGeneration:
    component: str
    links_per_gpu: int
    ports_per_chip: int
    chips_per_hgx8: int


NVSWITCH_GENERATIONS: Mapping[str, NVSwitchGeneration] = MappingProxyType({
    "sm80": NVSwitchGeneration("NVSwitch-gen2", 12, 36, 6),
    "sm90": NVSwitchGeneration("NVSwitch-gen3", 18, 64, 4),
    "sm100": NVSwitchGeneration("NVSwitch-gen4", 18, 72, 2),
})
"""NVLink generation per GPU ``arch`` (unknown arches use sm90's); see the module docstring for the rule."""

MEDIA = ("optics", "aoc", "dac")
"""How a cable is built: ``optics`` (a transceiver at each end plus a fibre), ``aoc`` (active optical cable),
``dac`` (passive copper)."""
FAMILIES = ("auto", "infiniband", "ethernet")
"""Switch family: ``auto`` takes the fabric links' ``kind`` (``ib`` -> InfiniBand, ``eth`` -> Ethernet)."""


def nvswitch_chips(gpus: int, arch: str, switch_links: int = 0) -> tuple[str, int]:
    """``(component name, chips)`` of NVSwitch for ``gpus`` GPUs of ``arch`` around one NVSwitch (one NVLink
    domain, or one rack of a domain that spans racks), whose chips also end ``switch_links`` NVLink links to
    other NVSwitches (the cables between the racks of a GB200 NVL36x2).

    Examples
    --------
    >>> nvswitch_chips(8, "sm90"), nvswitch_chips(72, "sm100"), nvswitch_chips(1, "sm90")
    (('NVSwitch-gen3', 4), ('NVSwitch-gen4', 18), ('NVSwitch-gen3', 0))
    >>> nvswitch_chips(36, "sm100", switch_links=36 * 18)  # one NVL36x2 rack: 9 switch trays of 2
    ('NVSwitch-gen4', 18)
    """
    gen = NVSWITCH_GENERATIONS.get(arch, NVSWITCH_GENERATIONS["sm90"])
    if gpus <= 1 and not switch_links:
        return gen.component, 0
    return gen.component, max(math.ceil((gpus * gen.links_per_gpu + switch_links) / gen.ports_per_chip),
                              gen.chips_per_hgx8 * math.ceil(gpus / 8))


@dataclass(frozen=True)
class PlanOptions(PicklesProxies):
    """Resolved ``plan:`` section.

    Attributes
    ----------
    port_speed_Bps : float or None
        Bytes/s of one switch port and one cable, one of the port speeds of
        :data:`SWITCH_MODELS`; ``None`` (``auto``): the fabric's most common
        NIC link rate (400 Gb/s when it has no NICs), rounded up to a speed
        the switch family offers.
    nic_media, switch_media : str
        How NIC-to-switch and switch-to-switch cables are built (:data:`MEDIA`).
    family : str
        Switch family (:data:`FAMILIES`).
    components : Mapping[str, Component]
        The priced parts, defaults with the overrides applied.
    """

    port_speed_Bps: float | None = None
    nic_media: str = "optics"
    switch_media: str = "optics"
    family: str = "auto"
    components: Mapping[str, Component] = field(default_factory=lambda: COMPONENTS)

    def key(self) -> tuple:
        """Hashable identity (for caches)."""
        return (self.port_speed_Bps, self.nic_media, self.switch_media, self.family,
                tuple((c.name, c.power_w, c.cost_usd) for c in self.components.values()))


PLAN_FIELDS = ("port_speed", "nic_media", "switch_media", "family", "components")
"""Every key a ``plan:`` section may hold."""


def _choice(value: object, key: str, valid: tuple[str, ...]) -> str:
    if isinstance(value, str) and value.strip().lower() in valid:
        return value.strip().lower()
    raise TopologyError(f"plan.{key}: {value!r} is not valid; valid: {', '.join(valid)}")


_UNIT_CEILING = {"power_w": 1e6, "cost_usd": 1e9}
"""Largest power (W) and price (USD) of one part: a switch draws kW and costs tens of thousands; a value above
these is a slip (``cost_usd: 1e300`` printed 300-digit totals), refused."""


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TopologyError(f"plan.{key}: {value!r} is not a number >= 0")
    ceiling = _UNIT_CEILING.get(key.rsplit(".", 1)[-1])
    if ceiling is not None and value > ceiling:
        raise TopologyError(f"plan.{key}: {value!r} is more than {ceiling:g} for one part; give the unit's own "
                            f"figure (e.g. 25000 USD, 650 W)")
    return float(value)


def _overrides(section: object) -> Mapping[str, Component]:
    if section is None:
        return COMPONENTS
    if not isinstance(section, Mapping):
        raise TopologyError(f"plan.components: expected a mapping such as {{QM9700: {{cost_usd: 25000}}}}, got "
                            f"{type(section).__name__}")
    parts = dict(COMPONENTS)
    for name, values in section.items():
        if name not in parts:
            raise TopologyError(f"plan.components.{name}: unknown component; valid: {', '.join(COMPONENTS)}")
        if not isinstance(values, Mapping) or not values:
            raise TopologyError(f"plan.components.{name}: expected a mapping with power_w and/or cost_usd, got "
                                f"{values!r}")
        for k in values:
            if k not in ("power_w", "cost_usd"):
                raise TopologyError(f"plan.components.{name}.{k}: unknown field; valid fields: power_w, cost_usd")
        new = {k: _number(v, f"components.{name}.{k}") for k, v in values.items()}
        sources = {"power_source" if k == "power_w" else "cost_source": "override" for k in new}
        parts[name] = replace(parts[name], **new, **sources)
    return MappingProxyType(parts)


def plan_options(section: Mapping[str, object] | PlanOptions | None = None) -> PlanOptions:
    """Resolve a ``plan:`` section (or pass a :class:`PlanOptions` through).

    Fields::

        plan:
          port_speed: auto          # or 200Gbps, 400Gbps, 800Gbps: one switch port and one cable
          nic_media: optics         # optics | aoc | dac, NIC <-> leaf cables
          switch_media: optics      # optics | aoc | dac, switch <-> switch cables
          family: auto              # auto | infiniband | ethernet
          components:               # override any default of COMPONENTS by name
            QM9700: {cost_usd: 25000, power_w: 650}

    Raises
    ------
    TopologyError
        One line naming ``plan.<field>`` and what is valid.

    Examples
    --------
    >>> plan_options({"port_speed": "800Gbps", "components": {"QM9700": {"cost_usd": 1}}}).port_speed_Bps
    100000000000.0
    """
    if isinstance(section, PlanOptions):
        return section
    if section is None:
        return PlanOptions()
    if not isinstance(section, Mapping):
        raise TopologyError(f"plan: expected a mapping of fields ({', '.join(PLAN_FIELDS)}), got "
                            f"{type(section).__name__}")
    for key in section:
        if key not in PLAN_FIELDS:
            raise TopologyError(f"plan.{key}: unknown field; valid fields: {', '.join(PLAN_FIELDS)}")
    speed = section.get("port_speed", "auto")
    family = _choice(section.get("family", "auto"), "family", FAMILIES)
    auto = speed is None or (isinstance(speed, str) and speed.strip().lower() == "auto")
    port_speed = None if auto else _port_speed(speed, family)
    return PlanOptions(port_speed_Bps=port_speed,
                       nic_media=_choice(section.get("nic_media", "optics"), "nic_media", MEDIA),
                       switch_media=_choice(section.get("switch_media", "optics"), "switch_media", MEDIA),
                       family=family, components=_overrides(section.get("components")))


def _port_speed(speed: object, family: str) -> float:
    """Bytes/s of ``plan.port_speed``, which must be a port speed of a switch of ``family`` (of any family when
    ``auto``) in :data:`SWITCH_MODELS`: a port runs at one of the speeds it is built for, and pricing another
    speed than the one asked for (300 Gb/s priced as 400G parts, 1 Gb/s as 200G ones) would be a silent guess."""
    port_speed = parse_bandwidth(speed, "plan.port_speed")
    speeds = sorted({m.port_Gbps for m in SWITCH_MODELS if family == "auto" or m.family == family})
    for s in speeds:
        if math.isclose(port_speed, s * _G, rel_tol=1e-9):
            return s * _G
    which = "" if family == "auto" else f" {family}"
    raise TopologyError(f"plan.port_speed: {speed!r} is not a port speed of any{which} switch priced here; valid: "
                        f"{', '.join(f'{s}Gbps' for s in speeds)}, or auto (the fabric's NIC rate, rounded up)")

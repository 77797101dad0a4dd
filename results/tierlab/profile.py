"""Lab profiles (workloads/profiles/NAME.toml): what one `tierlab pair` run sets
up, runs and gates on. docs/lab/pair.md documents every key; this module is the
one loader and validator, so the doc, the runner and the gate agree.

Every key is checked: an unknown key, a wrong type or a value out of range is a
LabError `PROFILE:KEY: what is wrong` (the command line exits 2). Sizes are
integers (bytes) or strings like "64MiB", "2GiB", "512K" (powers of 1024);
durations in seconds are numbers (`_s` keys). `--set KEY=VALUE` overrides any
scalar key after the file is read (VALUE is TOML; a bare word is a string), the
way faultdev's --set works, and is validated like the file."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlab import REPO_ROOT, LabError

PROFILES_DIR = REPO_ROOT / "workloads" / "profiles"
FAULT_PROFILES_DIR = REPO_ROOT / "faultdevices" / "profiles"
ORIGINS = ("foreground_read", "foreground_write", "journal", "btree", "alloc", "reconcile", "promote",
           "copygc", "readahead", "superblock", "fsck", "other")
PROBE_OPS = ("read", "write", "fsync", "fdatasync", "stat", "readdir", "openread", "create",
             "createsync")
FAULT_COMMANDS = ("stall", "unstall", "error", "clear", "powercut", "poweron")

_SIZE = re.compile(r"\s*([0-9]+)\s*([KMGT]?)(i?B)?\s*", re.IGNORECASE)


def parse_size(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise LabError(f"{where}: want a size (bytes or \"64MiB\"), got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise LabError(f"{where}: a size cannot be negative ({value})")
        return value
    if isinstance(value, str):
        m = _SIZE.fullmatch(value)
        if m:
            return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))
    raise LabError(f"{where}: want a size (bytes or \"64MiB\"), got {value!r}")


def size_text(n: int) -> str:
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


@dataclass
class Member:
    label: str          # group.name, e.g. "hdd.b"
    size: int           # bytes of the image (in RAM, fully written)
    fault: str | None   # faultdev profile name or path; None: no fault device
    fault_set: list[str] = field(default_factory=list)

    @property
    def group(self) -> str:
        return self.label.split(".", 1)[0]


@dataclass
class Event:
    at_s: float         # seconds after the measured phase starts
    member: str
    command: str        # as `tierfs ctl MNT fault MEMBER CMD` takes it, e.g. "stall 30s"

    @property
    def verb(self) -> str:
        return self.command.split()[0]

    @property
    def duration_s(self) -> float:
        """How long the event disturbs the device, for the report's window (a stall's
        length; 0 for the others)."""
        parts = self.command.split()
        if parts[0] == "stall" and len(parts) > 1:
            return parse_duration_s(parts[1], "event")
        return 0.0


def parse_duration_s(text: str, where: str) -> float:
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(ms|s|)", text.strip())
    if not m:
        raise LabError(f"{where}: bad duration '{text}' (e.g. 30s, 500ms, 30)")
    return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


@dataclass
class Profile:
    name: str
    path: str
    description: str
    seed: int
    members: list[Member]
    format: dict[str, Any]
    probe: dict[str, Any]
    background: dict[str, Any]
    phases: dict[str, float]
    events: list[Event]
    quiesce: dict[str, float]
    gate: dict[str, Any]
    raw: dict[str, Any]
    vm: dict[str, Any] = field(default_factory=dict)   # [vm]: guest settings (VM lab only)

    def slow_members(self) -> list[Member]:
        return [m for m in self.members if m.group == self.gate["slow_group"]]

    def member(self, label: str) -> Member | None:
        return next((m for m in self.members if m.label == label), None)

    def fs_members(self) -> list[Member]:
        """The members tierfs formats and mounts: all but `[vm] swap`."""
        return [m for m in self.members if m.label != self.vm.get("swap")]

    @property
    def needs_guest(self) -> str:
        """What only a VM lab guest can give ("" when nothing): swap on a
        member, a memory hog."""
        return " and ".join(f"vm.{k}" for k in ("swap", "hog") if self.vm.get(k))

    def slot_bytes(self) -> int:
        return sum(m.size for m in self.members)

    @property
    def workload_s(self) -> float:
        return self.phases["warmup_s"] + self.phases["measure_s"]


# --- the schema: section -> key -> (type check, default) ------------------------------

def _str(v: Any) -> bool:
    return isinstance(v, str)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _strlist(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _size(v: Any) -> bool:
    return _int(v) or isinstance(v, str)


TYPE_NAMES = {_str: "a string", _num: "a number", _int: "an integer", _bool: "true or false",
              _strlist: "a list of strings", _size: "a size (bytes or \"64MiB\")"}

TOP = {"description": (_str, ""), "seed": (_int, 1)}
MEMBER = {"label": (_str, None), "size": (_size, None), "fault": (_str, ""),
          "fault_set": (_strlist, [])}
FORMAT = {"foreground_target": (_str, "ssd"), "metadata_target": (_str, "ssd"),
          "background_target": (_str, "hdd"), "promote_target": (_str, ""),
          "bucket_size": (_str, ""), "compression": (_str, "none"),
          "extra_args": (_strlist, [])}
PROBE = {"mix": (_str, "read=40,write=20,fsync=5,fdatasync=5,stat=10,readdir=5,openread=10,create=5"),
         "rate": (_num, 500), "threads": (_int, 1), "schedule": (_str, "poisson"),
         "working_set": (_size, "64MiB"), "files": (_int, 256), "direct": (_bool, True),
         "spin": (_str, ""), "lane_per_op": (_bool, False), "keep_going": (_bool, True)}
BACKGROUND = {"workload": (_str, "bg-writer"), "dir": (_str, "cold"), "size": (_size, "256MiB"),
              "files": (_int, 4), "rate": (_str, "20m"), "start_s": (_num, 0), "keep": (_bool, True)}
PHASES = {"warmup_s": (_num, 5), "measure_s": (_num, 60)}
EVENT = {"at_s": (_num, None), "member": (_str, None), "command": (_str, None)}
QUIESCE = {"window_s": (_num, 10), "max_s": (_num, 60)}
# The guest of the VM lab (`tierlab vm run|pair`); 0 and "" mean unset: mem_mib
# and cpus are then the command line's defaults, no swap, no hog.
VM: dict[str, tuple[Any, Any]] = {"mem_mib": (_int, 0), "cpus": (_int, 0), "swap": (_str, ""),
                                  "hog": (_size, 0)}
GATE = {"op": (_str, "all"), "p99_ratio_max": (_num, 1.10), "throughput_ratio_min": (_num, 0.90),
        "max_latency": (_str, "2s"), "background_min_bytes": (_size, 0),
        "background_origins": (_strlist, ["reconcile", "copygc"]),
        "allowlist": (_strlist, ["reconcile", "copygc"]), "quiesce_max_s": (_num, 30),
        "slow_group": (_str, "hdd"), "slow_op": (_str, "50ms"),
        "spill_min_bytes": (_size, 0)}
SECTIONS = {"format": FORMAT, "probe": PROBE, "background": BACKGROUND, "phases": PHASES,
            "quiesce": QUIESCE, "gate": GATE, "vm": VM}
ARRAYS = {"members": MEMBER, "events": EVENT}


def _fill(table: Any, spec: dict[str, tuple[Any, Any]], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise LabError(f"{where}: want a table, got {type(table).__name__}")
    for key in table:
        if key not in spec:
            raise LabError(f"{where}.{key}: unknown key (known: {', '.join(spec)})"
                           if where else f"{key}: unknown key")
    out = {}
    for key, (check, default) in spec.items():
        k = f"{where}.{key}" if where else key
        if key not in table:
            if default is None:
                raise LabError(f"{k}: missing (required)")
            out[key] = list(default) if isinstance(default, list) else default
            continue
        v = table[key]
        if not check(v):
            raise LabError(f"{k}: want {TYPE_NAMES[check]}, got {v!r}")
        out[key] = v
    return out


def fault_path(fault: str) -> Path:
    """A member's fault profile given as a path: relative to workloads/profiles/."""
    p = Path(fault)
    return p if p.is_absolute() else (PROFILES_DIR / p).resolve()


def find(name: str) -> Path:
    """A profile by name (workloads/profiles/NAME.toml) or as a path."""
    p = Path(name)
    if p.suffix == ".toml" or "/" in name:
        return p
    return PROFILES_DIR / f"{name}.toml"


def names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def _set_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string, as faultdev's --set


def apply_sets(raw: dict[str, Any], sets: list[str], where: str) -> None:
    """--set section.key=VALUE (or key=VALUE for top-level keys) into the raw table."""
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise LabError(f"--set '{item}': want SECTION.KEY=VALUE")
        parts = key.strip().split(".")
        if len(parts) > 2 or parts[0] in ARRAYS:
            raise LabError(f"--set '{item}': only scalar keys of a section can be set "
                           "(members and events are edited in the file)")
        if len(parts) == 2:
            if parts[0] not in SECTIONS:
                raise LabError(f"{where}:{parts[0]}: unknown section (known: "
                               f"{', '.join(SECTIONS)})")
            raw.setdefault(parts[0], {})[parts[1]] = _set_value(value)
        else:
            raw[parts[0]] = _set_value(value)


def load(name: str, sets: list[str] | None = None) -> Profile:
    path = find(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        known = ", ".join(names())
        raise LabError(f"profile {name}: no such profile ({path}; shipped: {known})") from None
    except OSError as e:
        raise LabError(f"profile {name}: {path}: {e.strerror}") from None
    pname = path.stem
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LabError(f"{pname}: not TOML: {e}") from None
    apply_sets(raw, sets or [], pname)
    try:
        return _validate(pname, str(path), raw)
    except LabError as e:
        raise LabError(f"{pname}:{e}") from None


def _validate(name: str, path: str, raw: dict[str, Any]) -> Profile:
    known = set(TOP) | set(SECTIONS) | set(ARRAYS)
    for key in raw:
        if key not in known:
            raise LabError(f"{key}: unknown key (known: {', '.join(sorted(known))})")
    top = _fill({k: v for k, v in raw.items() if k in TOP}, TOP, "")
    if top["seed"] < 0:
        raise LabError(f"seed: must be >= 0 ({top['seed']})")
    sec = {s: _fill(raw.get(s, {}), spec, s) for s, spec in SECTIONS.items()}

    members_raw = raw.get("members")
    if not isinstance(members_raw, list) or not members_raw:
        raise LabError("members: want at least one [[members]] table")
    members = []
    for i, t in enumerate(members_raw):
        m = _fill(t, MEMBER, f"members[{i}]")
        if not re.fullmatch(r"[a-z][a-z0-9_-]*\.[a-z0-9_-]+", m["label"]):
            raise LabError(f"members[{i}].label: want GROUP.NAME like 'hdd.b', got {m['label']!r}")
        size = parse_size(m["size"], f"members[{i}].size")
        if size < 64 << 20 or size > 64 << 30:
            raise LabError(f"members[{i}].size: want 64MiB..64GiB, got {size_text(size)}")
        if size % (1 << 20):
            raise LabError(f"members[{i}].size: want whole MiB, got {size}")
        fault = m["fault"] or None
        if fault is not None and ("/" in fault or fault.endswith(".toml")):
            if not fault_path(fault).is_file():
                raise LabError(f"members[{i}].fault: no such file {fault_path(fault)}")
        elif fault is not None and not (FAULT_PROFILES_DIR / f"{fault}.toml").exists():
            shipped = ", ".join(sorted(p.stem for p in FAULT_PROFILES_DIR.glob("*.toml")))
            raise LabError(f"members[{i}].fault: no faultdev profile '{fault}' (shipped: {shipped})")
        for s in m["fault_set"]:
            if "=" not in s or s.startswith("="):
                raise LabError(f"members[{i}].fault_set: want SECTION.KEY=VALUE, got {s!r}")
        if m["fault_set"] and fault is None:
            raise LabError(f"members[{i}].fault_set: set without a fault profile")
        members.append(Member(m["label"], size, fault, list(m["fault_set"])))
    labels = [m.label for m in members]
    if len(set(labels)) != len(labels):
        raise LabError(f"members: a label appears twice ({', '.join(labels)})")
    groups = {m.group for m in members}

    f = sec["format"]
    for key in ("foreground_target", "metadata_target", "background_target", "promote_target"):
        t = f[key]
        if t and t not in groups and t not in labels:
            raise LabError(f"format.{key}: '{t}' names no member or group "
                           f"(groups: {', '.join(sorted(groups))})")
    if f["compression"] not in ("none", "zstd"):
        raise LabError(f"format.compression: want none or zstd, got {f['compression']!r}")
    if f["bucket_size"] and not re.fullmatch(r"[0-9]+[KM]?", f["bucket_size"]):
        raise LabError(f"format.bucket_size: want e.g. 1M or 256K, got {f['bucket_size']!r}")

    p = sec["probe"]
    if not p["rate"] > 0 or p["rate"] > 100000:
        raise LabError(f"probe.rate: want 0 < rate <= 100000 ops/s, got {p['rate']}")
    if not 1 <= p["threads"] <= 64:
        raise LabError(f"probe.threads: want 1..64, got {p['threads']}")
    if p["schedule"] not in ("constant", "poisson"):
        raise LabError(f"probe.schedule: want constant or poisson, got {p['schedule']!r}")
    p["working_set"] = parse_size(p["working_set"], "probe.working_set")
    if p["working_set"] < 1 << 20:
        raise LabError(f"probe.working_set: want at least 1MiB, got {p['working_set']}")
    if not 1 <= p["files"] <= 100000:
        raise LabError(f"probe.files: want 1..100000, got {p['files']}")
    weights: dict[str, int] = {}
    for item in p["mix"].split(","):
        op, eq, w = item.partition("=")
        if op.strip() not in PROBE_OPS or not eq or not w.strip().isdigit():
            raise LabError(f"probe.mix: want OP=WEIGHT,... with ops {', '.join(PROBE_OPS)}, "
                           f"got {item!r}")
        weights[op.strip()] = weights.get(op.strip(), 0) + int(w.strip())
    if not any(weights.values()):
        raise LabError(f"probe.mix: every weight is 0 (nothing to run), got {p['mix']!r}")

    b = sec["background"]
    if b["workload"] not in ("bg-writer", "none"):
        raise LabError(f"background.workload: want bg-writer or none, got {b['workload']!r}")
    b["size"] = parse_size(b["size"], "background.size")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", b["dir"]):
        raise LabError(f"background.dir: want one directory name, got {b['dir']!r}")
    if not 1 <= b["files"] <= 1024:
        raise LabError(f"background.files: want 1..1024, got {b['files']}")
    if not re.fullmatch(r"[0-9]+[kmg]?", b["rate"]):
        raise LabError(f"background.rate: want fio's rate like 20m or 0, got {b['rate']!r}")
    if b["start_s"] < 0:
        raise LabError(f"background.start_s: must be >= 0, got {b['start_s']}")

    ph = sec["phases"]
    if ph["warmup_s"] < 0 or ph["warmup_s"] > 3600:
        raise LabError(f"phases.warmup_s: want 0..3600, got {ph['warmup_s']}")
    if not 1 <= ph["measure_s"] <= 7200:
        raise LabError(f"phases.measure_s: want 1..7200, got {ph['measure_s']}")
    if b["start_s"] > ph["warmup_s"]:
        # a later start would delay the measure snapshot and every event
        raise LabError(f"background.start_s: want <= phases.warmup_s ({ph['warmup_s']}), "
                       f"got {b['start_s']}")

    events = []
    events_raw = raw.get("events", [])
    if not isinstance(events_raw, list):
        raise LabError("events: want [[events]] tables")
    for i, t in enumerate(events_raw):
        e = _fill(t, EVENT, f"events[{i}]")
        if e["member"] not in labels:
            raise LabError(f"events[{i}].member: '{e['member']}' is not a member ({', '.join(labels)})")
        if members[labels.index(e["member"])].fault is None:
            raise LabError(f"events[{i}].member: {e['member']} has no fault profile to command")
        verb = e["command"].split()[0] if e["command"].split() else ""
        if verb not in FAULT_COMMANDS:
            raise LabError(f"events[{i}].command: want one of {', '.join(FAULT_COMMANDS)}, "
                           f"got {e['command']!r}")
        if not 0 <= e["at_s"] < ph["measure_s"]:
            raise LabError(f"events[{i}].at_s: want 0 <= at_s < phases.measure_s "
                           f"({ph['measure_s']}), got {e['at_s']}")
        ev = Event(float(e["at_s"]), e["member"], " ".join(e["command"].split()))
        if verb == "stall":
            parts = ev.command.split()
            if len(parts) != 2:
                raise LabError(f"events[{i}].command: want 'stall DURATION', got {e['command']!r}")
            parse_duration_s(parts[1], f"events[{i}].command")
        events.append(ev)
    events.sort(key=lambda e: e.at_s)

    q = sec["quiesce"]
    if not 1 <= q["window_s"] <= 600:
        raise LabError(f"quiesce.window_s: want 1..600, got {q['window_s']}")
    if not q["window_s"] <= q["max_s"] <= 3600:
        raise LabError(f"quiesce.max_s: want window_s..3600, got {q['max_s']}")

    g = sec["gate"]
    live = [op for op, w in weights.items() if w > 0]
    if g["op"] != "all" and g["op"] not in live:
        raise LabError(f"gate.op: want all or an op of probe.mix with weight > 0 "
                       f"({', '.join(live)}), got {g['op']!r}")
    if not g["p99_ratio_max"] > 0:
        raise LabError(f"gate.p99_ratio_max: must be > 0, got {g['p99_ratio_max']}")
    if not g["throughput_ratio_min"] > 0:
        raise LabError(f"gate.throughput_ratio_min: must be > 0, got {g['throughput_ratio_min']}")
    try:
        g["max_latency_s"] = parse_duration_s(g["max_latency"], "gate.max_latency")
    except LabError:
        raise LabError(f"gate.max_latency: want a duration like 2s or 250ms, "
                       f"got {g['max_latency']!r}") from None
    try:
        g["slow_op_s"] = parse_duration_s(g["slow_op"], "gate.slow_op")
    except LabError:
        raise LabError(f"gate.slow_op: want a duration like 50ms, got {g['slow_op']!r}") from None
    g["background_min_bytes"] = parse_size(g["background_min_bytes"], "gate.background_min_bytes")
    g["spill_min_bytes"] = parse_size(g["spill_min_bytes"], "gate.spill_min_bytes")
    for key in ("background_origins", "allowlist"):
        for o in g[key]:
            if o not in ORIGINS:
                raise LabError(f"gate.{key}: '{o}' is not an origin ({', '.join(ORIGINS)})")
    if g["quiesce_max_s"] < 0:
        raise LabError(f"gate.quiesce_max_s: must be >= 0, got {g['quiesce_max_s']}")
    if g["quiesce_max_s"] + q["window_s"] > q["max_s"]:
        raise LabError(f"gate.quiesce_max_s: quiesce.max_s ({q['max_s']}) must leave room for "
                       f"the bound plus one window ({g['quiesce_max_s']} + {q['window_s']})")
    if not any(m.group == g["slow_group"] for m in members):
        raise LabError(f"gate.slow_group: no member in group '{g['slow_group']}'")
    vm = _validate_vm(sec["vm"], members, f, g)

    return Profile(name=name, path=path, description=top["description"], seed=top["seed"],
                   members=members, format=f, probe=p, background=b, phases=ph, events=events,
                   quiesce=q, gate=g, raw=raw, vm=vm)


def _validate_vm(vm: dict[str, Any], members: list[Member], f: dict[str, Any],
                 g: dict[str, Any]) -> dict[str, Any]:
    """[vm]: the guest's memory and CPUs, a member used as swap (never part of
    tierfs: no target, no gate group may name it), a memory hog's size."""
    if vm["mem_mib"] != 0 and not 256 <= vm["mem_mib"] <= 65536:
        raise LabError(f"vm.mem_mib: want 256..65536 (MiB), got {vm['mem_mib']}")
    if not 0 <= vm["cpus"] <= 64:
        raise LabError(f"vm.cpus: want 1..64, got {vm['cpus']}")
    swap = vm["swap"]
    if swap:
        labels = [m.label for m in members]
        if swap not in labels:
            raise LabError(f"vm.swap: '{swap}' is not a member ({', '.join(labels)})")
        group = swap.split(".", 1)[0]
        if any(m.group == group and m.label != swap for m in members):
            raise LabError(f"vm.swap: {swap} shares group '{group}' with tierfs members "
                           "(give the swap member a group of its own, e.g. swap.c)")
        if len(members) < 2:
            raise LabError(f"vm.swap: {swap} is the only member (nothing left for tierfs)")
        for key in ("foreground_target", "metadata_target", "background_target",
                    "promote_target"):
            if f[key] in (swap, group):
                raise LabError(f"format.{key}: '{f[key]}' names the swap member {swap} (vm.swap)")
        if g["slow_group"] == group:
            raise LabError(f"gate.slow_group: '{group}' is the swap member's group (vm.swap)")
    vm["hog"] = parse_size(vm["hog"], "vm.hog")
    if vm["hog"] and (vm["hog"] < 1 << 20 or vm["hog"] % (1 << 20)):
        raise LabError(f"vm.hog: want whole MiB, at least 1MiB, got {vm['hog']}")
    if vm["hog"] and vm["mem_mib"] and vm["hog"] >= vm["mem_mib"] << 20:
        raise LabError(f"vm.hog: {size_text(vm['hog'])} is not below the guest's memory "
                       f"(vm.mem_mib {vm['mem_mib']})")
    return vm


def format_args(p: Profile, images: dict[str, str]) -> list[str]:
    """`tierfs format` arguments for the profile, member images by label."""
    args: list[str] = []
    for m in p.fs_members():
        args += ["--label", m.label, images[m.label]]
    f = p.format
    for key in ("foreground_target", "metadata_target", "background_target", "promote_target"):
        if f[key]:
            args += [f"--{key.replace('_', '-')}", f[key]]
    if f["bucket_size"]:
        args += ["--bucket-size", f["bucket_size"]]
    if f["compression"] != "none":
        args += ["--compression", f["compression"]]
    return args + list(f["extra_args"])


def fault_args(p: Profile, seed: int) -> list[str]:
    """`--fault MEMBER=PROFILE --fault-set MEMBER:KEY=VALUE ...` for mount; every
    fault device gets the run's seed."""
    args: list[str] = []
    for m in p.members:
        if m.fault is None:
            continue
        fault = m.fault
        if "/" in fault or fault.endswith(".toml"):
            fault = str(fault_path(fault))
        args += ["--fault", f"{m.label}={fault}"]
        for s in [f"seed={seed}", *m.fault_set]:
            args += ["--fault-set", f"{m.label}:{s}"]
    return args


def register(sub: Any) -> None:
    import argparse

    p = sub.add_parser("profile", help="check lab profiles and show what they set up",
                       description="Load and validate lab profiles (workloads/profiles/NAME.toml "
                       "or a path; docs/lab/pair.md); print one summary line each. Without "
                       "names: every shipped profile. Exit 2 on the first bad one.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.set_defaults(run=_run)


def _run(args: Any) -> int:
    for n in args.names or names():
        p = load(n, args.set)
        mem = ", ".join(f"{m.label} {size_text(m.size)}" + (f" {m.fault}" if m.fault else "")
                        for m in p.members)
        ev = "; ".join(f"{e.at_s:g}s {e.member} {e.command}" for e in p.events) or "no events"
        vm = ", ".join(f"{k} {size_text(v) if k == 'hog' else v}" for k, v in p.vm.items() if v)
        print(f"{p.name}: {mem}; probe {p.probe['rate']:g}/s; {p.phases['warmup_s']:g}+"
              f"{p.phases['measure_s']:g} s; {ev}" + (f"; vm: {vm}" if vm else "")
              + f"; {p.description}")
    return 0

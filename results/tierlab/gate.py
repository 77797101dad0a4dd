"""Gate bounds for `tierlab report`: what "B passes against A" means.

Bounds come from a small file (one `key = value` per line, `#` comments) and/or
command-line options, options winning:

    p99_ratio_max = 1.10         # p99 latency B/A (point estimate) at most this
    p999_ratio_max = 1.50        # optional; do not gate on p99.9 of a few thousand ops
    throughput_ratio_min = 0.90  # throughput B/A at least this
    max_latency = 2s             # no operation of arm B above this
    op = all                     # which op the latency criteria look at

Whenever a gate is given, one more criterion is always added ("rate kept"): no
run fell behind its schedule (a probe that fell behind became closed-loop and hid
stalls; the producer decides and says so in the counter fell_behind)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierlab import LabError

_UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9, "": 1e9}


def parse_duration_ns(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|ms|s|)\s*", text)
    if not m:
        raise LabError(f"bad duration '{text}' (e.g. 2s, 250ms, 40us)")
    return int(round(float(m.group(1)) * _UNITS[m.group(2)]))


@dataclass
class Gate:
    p99_ratio_max: float | None = None
    p999_ratio_max: float | None = None
    throughput_ratio_min: float | None = None
    max_latency_ns: int | None = None
    op: str = "all"
    source: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.p99_ratio_max, self.p999_ratio_max,
                                           self.throughput_ratio_min, self.max_latency_ns))

    def set(self, key: str, value: str, where: str) -> None:
        try:
            if key in ("p99_ratio_max", "p999_ratio_max", "throughput_ratio_min"):
                v = float(value)
                if not v > 0:
                    raise ValueError
                setattr(self, key, v)
            elif key == "max_latency":
                self.max_latency_ns = parse_duration_ns(value)
            elif key == "op":
                self.op = value.strip()
            else:
                raise LabError(f"{where}: unknown gate key '{key}' (p99_ratio_max, "
                               "p999_ratio_max, throughput_ratio_min, max_latency, op)")
        except ValueError:
            raise LabError(f"{where}: bad value '{value}' for {key}") from None


def load(path: str | None) -> Gate:
    g = Gate()
    if path is None:
        return g
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise LabError(f"--gate {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise LabError(f"--gate {path}: not a gate file: byte {e.start} is not UTF-8") from None
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, value = line.partition("=")
        if not eq:
            raise LabError(f"{path}:{n}: want KEY = VALUE, got '{line}'")
        g.set(key.strip(), value.strip(), f"{path}:{n}")
    g.source.append(str(path))
    return g


def register(sub: Any) -> None:
    p = sub.add_parser("gate", help="the gate of a `tierlab pair` directory (exit 0 pass, 1 fail)",
                       description="Evaluate the profile's gate criteria on a tierlab pair "
                       "directory and print one PASS/FAIL line per criterion (docs/lab/pair.md). "
                       "Exit 0 when every gating criterion passes, 1 when one fails, 2 on bad "
                       "input. Bounds come from the profile the runs used; --set overrides them.")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--set", action="append", default=[], metavar="gate.KEY=VALUE",
                   help="override a profile key, e.g. gate.p99_ratio_max=1.2 (repeatable)")
    p.add_argument("--json", metavar="FILE", help="also write the criteria as JSON")
    p.set_defaults(run=_run)


def _run(args: Any) -> int:
    from tierlab import labgate

    return labgate.gate_main(args)

"""`tierlab vm`: the VM lab's guest image and single boots (docs/lab/vmlab.md).

    tierlab vm image [--rebuild] [--json] [--prune] [--guest DIR] [--static-build DIR] [--cache DIR]
    tierlab vm boot --member LABEL=SIZE[:FAULTPROFILE] ... --job SCRIPT --out DIR
                    [--input FILE]... [--timeout S] [--budget S] [--cpus N] [--mem MiB]
                    [--event T:LABEL:COMMAND]... [--events-after MARK] [--fault-set LABEL:KEY=VALUE]...
                    [--images DIR] [--seed S] [--accel auto|kvm|tcg] [--backend qemu|libvirt [--connect URI]]
    tierlab vm run  --profile NAME --arm active|control --out DIR [--set SECTION.KEY=VALUE]...
    tierlab vm pair --profile NAME --pairs N --out DIR [--arms active,control]
                    [--baseline STATIC_BUILD --candidate STATIC_BUILD] [--set SECTION.KEY=VALUE]...
                    [--backend qemu|libvirt [--connect URI]...]

`image` builds the guest image when its inputs changed (cached in
build/vmlab/images/KEY) and prints what is in it. `boot` boots one guest with
the image: members served by `faultdev serve` over NBD, the job run by the
guest's init, DIR/{boot.json,console.log,results/} left behind. Exit status of
`boot`: 0 when the boot is ok, 1 when it failed or timed out, 2 for a mistake.
`--backend libvirt` starts the same guest as a transient domain of a local
libvirt daemon (`--connect URI`, default qemu:///system); with several
`--connect`, `vm pair` runs pair i on the (i mod n)-th."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tierlab import LabError, vmboot, vmimage, vmlibvirt


def image_options(args: argparse.Namespace) -> vmimage.Options:
    def log(msg: str) -> None:
        print(f"tierlab vm: {msg}", flush=True)
    opts = vmimage.Options(log=log, rebuild=getattr(args, "rebuild", False))
    if args.guest:
        opts.guest = Path(args.guest)
    if args.cache:
        opts.cache = Path(args.cache)
    if args.static_build:
        opts.static_bin = Path(args.static_build) / "bin"
    return opts


def add_image_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--guest", metavar="DIR", help="guest files: init, modules.txt, packages.txt "
                   "(default vmlab/guest)")
    p.add_argument("--cache", metavar="DIR", help="image cache, downloads and the static build "
                   "(default $TIERFS_BUILD/vmlab, build/vmlab)")
    p.add_argument("--static-build", metavar="BUILD_DIR", help="take the static tierfs and tierprobe "
                   "from BUILD_DIR/bin, without building (default: build them in CACHE/static)")


def register(sub: Any) -> None:
    p = sub.add_parser("vm", help="the VM lab: guest image, single boots, profile runs and pairs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vsub = p.add_subparsers(dest="vm_command", metavar="SUBCOMMAND", required=True)

    pi = vsub.add_parser("image", help="build (when its inputs changed) and describe the guest image")
    add_image_args(pi)
    pi.add_argument("--rebuild", action="store_true", help="build even when the cache has the image "
                    "(refused while a running tierlab vm process uses it)")
    pi.add_argument("--json", action="store_true", help="print the image's manifest as JSON")
    pi.add_argument("--prune", action="store_true", help="remove every other cached image")
    pi.set_defaults(run=run_image, error_prefix="vm image")

    pb = vsub.add_parser("boot", help="boot one guest, run a job, collect its results")
    add_image_args(pb)
    pb.add_argument("--member", action="append", default=[], metavar="LABEL=SIZE[:FAULTPROFILE]",
                    help="a member disk, served by faultdev serve (repeatable; e.g. hdd.b=2G:hdd-7200)")
    pb.add_argument("--job", required=True, metavar="SCRIPT", help="the job: a busybox sh script")
    pb.add_argument("--input", action="append", default=[], metavar="FILE",
                    help="a file the job gets in $JOB/inputs/ (repeatable)")
    pb.add_argument("--out", required=True, metavar="DIR", help="output directory (new or empty)")
    pb.add_argument("--timeout", type=float, default=600.0, metavar="S",
                    help="hard limit of the whole boot; the guest is killed after it (default 600)")
    pb.add_argument("--budget", type=float, metavar="S",
                    help="the job's limit inside the guest (default: timeout - 60, at least half of it)")
    pb.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    pb.add_argument("--mem", type=int, default=1024, metavar="MiB", help="guest memory (default 1024)")
    pb.add_argument("--event", action="append", default=[], metavar="T:LABEL:COMMAND",
                    help="faultdev ctl COMMAND to LABEL's device T s after the job starts "
                         "(e.g. 30:hdd.b:stall 10; repeatable)")
    pb.add_argument("--events-after", metavar="MARK",
                    help="time the events from the job's console line 'tierlab-mark: MARK' "
                         "instead of its start")
    pb.add_argument("--fault-set", action="append", default=[], metavar="LABEL:KEY=VALUE",
                    help="override a key of LABEL's fault profile (faultdev --set; repeatable)")
    pb.add_argument("--images", metavar="DIR", help="member images (kept; an image of the right size "
                    "is reused); default: a new directory under /dev/shm")
    pb.add_argument("--seed", type=int, default=1, help="fault device seed (default 1)")
    pb.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                    help="auto: KVM when /dev/kvm opens, else TCG")
    vmlibvirt.add_backend_args(pb)
    pb.set_defaults(run=run_boot, error_prefix="vm boot")

    from tierlab import vmpair
    vmpair.register(vsub)


def run_image(args: argparse.Namespace) -> int:
    image = vmimage.ensure(image_options(args))
    if args.prune:
        for d in vmimage.prune(image.dir.parent.parent, image.key):
            print(f"tierlab vm: removed {d}")
    if args.json:
        print(json.dumps(image.manifest, indent=1))
    else:
        print(vmimage.describe(image))
    return 0


def run_boot(args: argparse.Namespace) -> int:
    members = [vmboot.parse_member(m) for m in args.member]
    if not members:
        raise LabError("no members: give --member LABEL=SIZE[:FAULTPROFILE]")
    labels = [m.label for m in members]
    events = [vmboot.parse_event(e, labels) for e in args.event]
    sets: dict[str, list[str]] = {}
    for s in args.fault_set:
        label, colon, kv = s.partition(":")
        if not colon or "=" not in kv or label not in labels:
            raise LabError(f"bad --fault-set '{s}': want LABEL:KEY=VALUE with a member's label")
        sets.setdefault(label, []).append(kv)
    if args.cpus < 1 or args.mem < 128 or args.timeout <= 0:
        raise LabError("--cpus must be at least 1, --mem at least 128, --timeout positive")
    job = Path(args.job)
    if not job.is_file():
        raise LabError(f"job script {job} does not exist")
    # The options first, then what this host lacks: a mistake in them is
    # reported as such on a host without QEMU too (vm pair checks in this order).
    uris = vmlibvirt.backend_uris(args, several=False)
    if vmboot.shutil.which(vmboot.QEMU) is None:
        raise LabError(f"{vmboot.QEMU} is not installed: run scripts/install-deps lab")
    from tierlab.pair import default_build
    image = vmimage.ensure(image_options(args))
    spec = vmboot.BootSpec(
        image=image, members=members, job=job, out=Path(args.out), build=default_build(),
        inputs=[Path(i) for i in args.input], images_dir=Path(args.images) if args.images else None,
        timeout=args.timeout, budget=args.budget, cpus=args.cpus, mem_mib=args.mem,
        events=events, fault_sets=sets, seed=args.seed, accel=args.accel,
        events_after=args.events_after, backend=args.backend, connect=uris[0] if uris else None)
    result = vmboot.boot(spec)
    print(vmboot.summary(result, Path(args.out)))
    print(f"member images: {', '.join(m['image'] for m in result['members'])}")
    return 0 if result["status"] == "ok" else 1


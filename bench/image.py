"""`python -m bench.image`: build the Dockerfile and print what the image weighs, as JSON (also in results/image.json).

Sizes are the engine's own (`image inspect`: uncompressed, all layers), for the image, its base, and the difference
(the virtualenv and the user: what the project adds). Podman or Docker, whichever is installed (`--engine`).

`--base IMAGE` builds on another Python image (the Dockerfile's PYTHON_IMAGE), for a machine that cannot pull
python:3.11-slim; its size is then the base's figure. `--sandbox` adds what Podman needs as root inside a VM without
systemd, cgroup delegation or CAP_SYS_RESOURCE: vfs storage, chroot isolation for RUN, the host's network, and
ulimits no higher than the shell's. `--quick` measures an image already built under `--tag` instead of building.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.setup import RESULTS, ROOT, source_version, write_report

DEFAULT_BASE = "python:3.11-slim"


def engine_command(engine: str, *, sandbox: bool) -> list[str]:
    return [engine, "--storage-driver=vfs"] if sandbox and engine.endswith("podman") else [engine]


def build_options(*, sandbox: bool) -> list[str]:
    if not sandbox:
        return []
    options = ["--format", "docker", "--isolation", "chroot", "--network", "host"]
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft = min(resource.getrlimit(limit)[0], 1024)
        options += ["--ulimit", f"{name}={soft}:{soft}"]
    return options


def size(engine: list[str], image: str) -> int:
    inspect = [*engine, "image", "inspect", "--format", "{{.Size}}", image]
    shown = subprocess.run(inspect, capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"cannot inspect {image}: {shown.stderr.strip()}")
    return int(shown.stdout.strip())


def main(quick: bool = False, results: Path = RESULTS, argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__)
    parser.add_argument("--engine", default=shutil.which("podman") or shutil.which("docker") or "docker")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the Python image to build on (default {DEFAULT_BASE})")
    parser.add_argument("--tag", default="helpdesk-bot:bench")
    parser.add_argument("--sandbox", action="store_true", help="Podman as root in a VM (see above)")
    parser.add_argument("--quick", action="store_true", help="measure the image under --tag without building it")
    parser.add_argument("--results", type=Path, default=results, help="folder for image.json")
    args = parser.parse_args([] if argv is None else argv)
    engine = engine_command(args.engine, sandbox=args.sandbox)
    started = time.perf_counter()
    build_s = None
    if not (quick or args.quick):
        command = [*engine, "build", *build_options(sandbox=args.sandbox), "--build-arg", f"PYTHON_IMAGE={args.base}"]
        built = subprocess.run([*command, "--tag", args.tag, str(ROOT)], capture_output=True, text=True)
        if built.returncode != 0:
            print(built.stdout[-3000:], built.stderr[-3000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"the build failed ({built.returncode})")
        build_s = round(time.perf_counter() - started, 1)
    image, base = size(engine, args.tag), size(engine, args.base)
    report = {
        "benchmark": "image",
        "engine": " ".join(engine),
        "base": args.base,
        "image_mb": round(image / 1e6, 1),
        "base_mb": round(base / 1e6, 1),
        "added_mb": round((image - base) / 1e6, 1),
        "build_s": build_s,
        "constraints": (ROOT / "constraints.txt").is_file(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source_version(),
        "total_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    return write_report(report, args.results / "image.json")


if __name__ == "__main__":
    main(argv=sys.argv[1:])

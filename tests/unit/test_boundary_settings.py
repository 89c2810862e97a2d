"""Settings that would weaken a boundary are refused when the settings are built (exit 2
from every command, nothing written): a command user of uid 0 (``0``, ``0:0``, ``root``,
any name the machine resolves to uid 0), and a command environment that would hand a job
jobfence's own settings (``JOBFENCE_*``: the database URL among them) or a well-known
credential of the worker's (``AWS_*``, ``PGPASSWORD``, ``KUBECONFIG``...). Fuzzed with
hypothesis where the space is large."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobfence.errors import ConfigError
from jobfence.settings import load_settings
from jobfence.settings.commands import CREDENTIAL_NAMES, CREDENTIAL_PREFIXES

DSN = "postgresql://nobody@127.0.0.1:1/none"


@pytest.mark.parametrize("user", ["0", "0:0", "0:1000", "root", " root", "00"])
def test_a_command_user_of_uid_0_is_refused(user: str) -> None:
    with pytest.raises(ConfigError, match=r"JOBFENCE_COMMAND_USER.*uid 0"):
        load_settings(database_url=DSN, command_user=user)


@pytest.mark.parametrize("user", [None, "worker", "nobody", "65534", "10001:10001",
                                  "no-such-user-here"])
def test_other_command_users_are_accepted(user: str | None) -> None:
    assert load_settings(database_url=DSN, command_user=user).command_user == user


@pytest.mark.parametrize("name", ["JOBFENCE_DATABASE_URL", "JOBFENCE_S3_BUCKET", "jobfence_x",
                                  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD",
                                  "PGPASSFILE", "PGSERVICEFILE", "KUBECONFIG", "DATABASE_URL",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "aws_access_key_id"])
def test_a_command_env_passing_a_setting_or_a_credential_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"JOBFENCE_COMMAND_ENV.*{name}"):
        load_settings(database_url=DSN, command_env=f"HOME,{name},LANG")


@settings(deadline=None)  # a loaded machine is not a failure
@given(st.sampled_from((*CREDENTIAL_PREFIXES, "JOBFENCE_")),
       st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", max_size=20),
       st.lists(st.sampled_from(["HOME", "LANG", "TZ", "PATH", "MY_APP_MODE"]), max_size=3))
def test_any_name_under_a_refused_prefix_is_refused_wherever_it_stands(
        prefix: str, rest: str, others: list[str]) -> None:
    names = [*others, prefix + rest, *others]
    with pytest.raises(ConfigError, match="JOBFENCE_COMMAND_ENV"):
        load_settings(database_url=DSN, command_env=",".join(names))


@settings(deadline=None)  # a loaded machine is not a failure
@given(st.lists(st.sampled_from(sorted(CREDENTIAL_NAMES)), min_size=1, max_size=3),
       st.lists(st.sampled_from(["HOME", "LANG", "TZ", "MY_APP_MODE"]), max_size=3))
def test_any_listed_credential_is_refused(bad: list[str], others: list[str]) -> None:
    with pytest.raises(ConfigError, match="JOBFENCE_COMMAND_ENV"):
        load_settings(database_url=DSN, command_env=",".join([*others, *bad]))


@settings(deadline=None)  # a loaded machine is not a failure
@given(st.lists(st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True), max_size=5))
def test_ordinary_names_pass(names: list[str]) -> None:
    names = [n for n in names if not n.startswith((*CREDENTIAL_PREFIXES, "JOBFENCE_"))
             and n not in CREDENTIAL_NAMES]
    assert load_settings(database_url=DSN, command_env=",".join(names)).command_env == \
        ",".join(names)


@pytest.mark.parametrize("env", [{"JOBFENCE_COMMAND_USER": "root"},
                                 {"JOBFENCE_COMMAND_ENV": "JOBFENCE_DATABASE_URL"}])
def test_the_worker_exits_2_with_the_reason_before_it_connects(env: dict[str, str]) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBFENCE_")}
    r = subprocess.run([sys.executable, "-m", "jobfence.functions.cli", "worker"],
                       env={**base, "JOBFENCE_DATABASE_URL": DSN, **env},
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert next(iter(env)) in r.stderr and "Traceback" not in r.stderr


def test_the_explicit_override_lets_a_setting_through() -> None:
    s = load_settings(database_url=DSN, command_env="JOBFENCE_DATABASE_URL,AWS_PROFILE",
                      command_env_allow_secrets=True)
    assert s.command_env == "JOBFENCE_DATABASE_URL,AWS_PROFILE"
    with pytest.raises(ConfigError, match="uid 0"):  # never for root
        load_settings(database_url=DSN, command_user="root", command_env_allow_secrets=True)

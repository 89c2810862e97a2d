"""Which connection strings jobfence keeps to the writer: a URL naming several hosts (a
failover set) is given ``target_session_attrs=read-write`` unless it chose otherwise; one
host (a service that follows the primary, PgBouncer) is taken as given."""

from __future__ import annotations

import pytest

from jobfence.db import writer_params


@pytest.mark.parametrize("dsn", [
    "postgresql://u@db-0:5432,db-1:5432,db-2:5432/jobs",
    "postgresql://u@db-0,db-1/jobs?connect_timeout=2",
    "host=db-0,db-1 port=5432,5433 dbname=jobs",
])
def test_a_multi_host_url_is_kept_to_the_writer(dsn: str) -> None:
    assert writer_params(dsn) == {"target_session_attrs": "read-write"}


@pytest.mark.parametrize("dsn", [
    "postgresql://u@db-rw:5432/jobs",
    "postgresql://u@db-0,db-1/jobs?target_session_attrs=any",
    "postgresql://u@db-0,db-1/jobs?target_session_attrs=primary",
    "host=/run/postgresql dbname=jobs",
    "not a connection string at all = =",
])
def test_one_host_or_a_chosen_target_is_left_as_given(dsn: str) -> None:
    assert writer_params(dsn) == {}

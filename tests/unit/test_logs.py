"""The JSON log lines (``jobfence.logs``), written without structlog: each line is one JSON
object with the call's keywords, ``event``, the configured context (from any thread),
``level`` and a UTC ``timestamp``; lines below the level are not written; an exception's
traceback is in ``exception``; a value JSON cannot hold is its ``repr``; the console format
still goes through structlog."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from typing import Any

import pytest

from jobfence.logs import configure, get_logger

log = get_logger("jobfence.test")


def lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines()]


def test_a_line_has_its_keywords_event_context_level_and_time(
        capsys: pytest.CaptureFixture[str]) -> None:
    configure("json", "info", command="worker")
    log.info("job_succeeded", job_id="j1", attempt=1)
    [line] = lines(capsys.readouterr().err)
    stamp = line.pop("timestamp")
    assert line == {"job_id": "j1", "attempt": 1, "event": "job_succeeded",
                    "command": "worker", "level": "info"}
    assert stamp.endswith("Z") and datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_the_context_reaches_lines_of_other_threads(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json", "info", command="worker")
    t = threading.Thread(target=lambda: log.warning("from_a_slot"))
    t.start()
    t.join()
    [line] = lines(capsys.readouterr().err)
    assert (line["event"], line["command"], line["level"]) == ("from_a_slot", "worker",
                                                               "warning")


def test_a_keyword_wins_over_the_context(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json", "info", command="cli")
    log.error("command_crashed", command="sweeper")
    assert lines(capsys.readouterr().err)[0]["command"] == "sweeper"


@pytest.mark.parametrize(("level", "written"), [
    ("debug", ["debug", "info", "warning", "error"]), ("info", ["info", "warning", "error"]),
    ("warning", ["warning", "error"]), ("error", ["error"])])
def test_lines_below_the_level_are_not_written(capsys: pytest.CaptureFixture[str], level: str,
                                               written: list[str]) -> None:
    configure("json", level)
    log.debug("a")
    log.info("b")
    log.warning("c")
    log.error("d")
    assert [line["level"] for line in lines(capsys.readouterr().err)] == written


def test_an_exception_is_written_with_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json", "info")
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("command_crashed")
    [line] = lines(capsys.readouterr().err)
    assert line["level"] == "error" and "exc_info" not in line
    assert line["exception"].startswith("Traceback") and "ValueError: bad value" in line[
        "exception"]


def test_a_value_json_cannot_hold_is_its_repr(capsys: pytest.CaptureFixture[str]) -> None:
    class Odd:
        def __repr__(self) -> str:
            return "<odd>"

    configure("json", "info")
    log.info("odd", value=Odd(), text="\x00\u2028", number=1.5)
    [line] = lines(capsys.readouterr().err)
    assert (line["value"], line["text"], line["number"]) == ("<odd>", "\x00\u2028", 1.5)


def test_the_console_format_goes_through_structlog(capsys: pytest.CaptureFixture[str]) -> None:
    configure("console", "info", command="status")
    log.info("looked", job_id="j2")
    log.debug("not_written")
    err = capsys.readouterr().err
    configure("json", "info")
    assert "looked" in err and "job_id" in err and "j2" in err and "not_written" not in err
    assert not err.lstrip().startswith("{")

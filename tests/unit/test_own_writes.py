"""OwnWrites: the bookkeeping of the operator's writes until their watch events come back."""

from __future__ import annotations

from rljob_operator.own_writes import OWN_WRITES_KEPT, UNSEEN_RAYJOB_SECONDS, OwnWrites

KEY = ("ml", "job-a")


def test_the_echo_of_a_write_is_known_for_the_last_few_writes() -> None:
    own = OwnWrites()
    assert not own.echo(KEY, None) and not own.echo(KEY, ("job", "1"))
    for version in range(1, OWN_WRITES_KEPT + 2):
        own.ours(KEY, ("job", str(version)))
    assert not own.echo(KEY, ("job", "1"))  # the oldest went
    assert own.echo(KEY, ("job", str(OWN_WRITES_KEPT + 1))) and not own.echo(("ml", "other"), ("job", "2"))
    assert not own.echo(KEY, None)  # a pod's event, a retry, the resync: never an echo


def test_the_job_is_behind_until_the_event_of_that_version() -> None:
    own = OwnWrites()
    own.job_written(KEY, "7")
    own.job_event(KEY, "6")  # an older event (someone's write before ours) does not clear it
    assert own.job_behind(KEY)
    own.job_event(KEY, "7")
    assert not own.job_behind(KEY) and own.keys() == set()


def test_a_rayjob_mark_goes_with_an_event_of_that_uid_or_after_a_minute() -> None:
    now = [100.0]
    own = OwnWrites(clock=lambda: now[0])
    own.rayjob_written("ml", "job-a-train", "uid-2")
    own.rayjob_seen("ml", "job-a-train", "uid-1")  # the RayJob deleted for a restart: not this one
    assert own.rayjob_behind("ml", "job-a-train")
    own.rayjob_seen("ml", "job-a-train", "uid-2")
    assert not own.rayjob_behind("ml", "job-a-train")
    own.rayjob_written("ml", "job-a-train", "uid-3")
    now[0] += UNSEEN_RAYJOB_SECONDS
    own.drop_stale_rayjob_marks()
    assert own.rayjob_behind("ml", "job-a-train")  # a minute exactly: kept
    now[0] += 1
    own.drop_stale_rayjob_marks()
    assert not own.rayjob_behind("ml", "job-a-train")


def test_forgetting_a_job_keeps_its_rayjobs_marks() -> None:
    """A job deleted and created again at once must still read its old RayJob from the API server."""
    own = OwnWrites()
    own.ours(KEY, ("job", "3"))
    own.job_written(KEY, "3")
    own.rayjob_written("ml", "job-a-train", "uid-1")
    own.forget_job(KEY)
    assert not own.echo(KEY, ("job", "3")) and not own.job_behind(KEY)
    assert own.rayjob_behind("ml", "job-a-train") and own.keys() == {("ml", "job-a-train")}
